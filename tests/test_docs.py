"""Every code block of README.md and docs/ runs as written, and every relative link resolves.

How a page's blocks run (docs/index.md, "Writing these pages", says the same to authors):

- A page runs in an empty temporary folder of its own, its blocks in order, with the Python
  that runs these tests as `python`, `opgen` as `python -m opgen`, and the repository on
  `PYTHONPATH` (so `import generated` finds the committed package unless the page wrote its own).
- ```sh / ```bash blocks run in bash (`-eu -o pipefail`). ```python blocks run in one Python
  session that lasts until the next shell block: a shell block between them is the reader
  going back to the terminal (after `opgen generate`, a fresh session imports the new package).
- A ```yaml block whose first line is `# PATH` is written to PATH before the next block runs
  (the tutorial's `# specs/squareplus.yaml`). Every other ```yaml block with a top-level
  `name:` is a spec: the page's specs are generated together and must give no problem.
- A block that must not run says so: a ```text fence, or `<!-- docs-test: skip: WHY -->` on
  the line before its fence. Few do; `test_few_blocks_are_left_out` counts them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINKED = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
RUN = {"python": "python", "sh": "sh", "bash": "sh", "yaml": "yaml"}
SKIP = re.compile(r"<!-- docs-test: skip: .+ -->")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)

# README sections whose blocks do not run in the README's own folder: the transforms examples
# use the whole op library (`generated.Linear`, `generated.mish`), and tests/test_readme_transforms.py
# runs them against the committed package and checks their results; the forward-mode fragments use
# a `model` the README never makes.
NOT_YET_RUN = {
    ("README.md", "Using generated ops with torch.func, torch.compile and torch.library"),
    ("README.md", "Forward mode (jvp)"),
}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first line of code, 1-based
    lang: str
    text: str
    skipped: bool

    @property
    def where(self) -> str:
        return f"{_shown(self.page)}:{self.line}"


def _shown(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def _section(text: str, offset: int) -> str:
    headings = re.findall(r"^#{1,6} (.+)$", text[:offset], flags=re.MULTILINE)
    return headings[-1] if headings else ""


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        pending = (page.name, _section(text, match.start())) in NOT_YET_RUN and page.parent == ROOT
        line = text.count("\n", 0, match.start(2)) + 1
        found.append(Block(page, line, match.group(1), match.group(2), bool(SKIP.fullmatch(before)) or pending))
    return found


def _tools(folder: Path) -> dict[str, str]:
    """An environment whose `python` and `opgen` are this test run's, with the repository importable."""
    bin_dir = folder / ".bin"
    bin_dir.mkdir(parents=True)
    shims = {"python": f'exec "{sys.executable}" "$@"', "opgen": f'exec "{sys.executable}" -m opgen "$@"'}
    for name, command in shims.items():
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\n{command}\n")
        shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env["MPLBACKEND"] = "Agg"
    return env


# Runs a Python session's blocks in one namespace; each block compiled under its page and line.
SESSION = """
import json, sys
namespace = {"__name__": "__main__"}
for where, line, text in json.load(open(sys.argv[1], encoding="utf-8")):
    exec(compile("\\n" * (line - 1) + text, where, "exec"), namespace)
"""


def _run_python(session: list[Block], folder: Path, env: dict[str, str]) -> None:
    script = folder / ".session.json"
    script.write_text(json.dumps([[_shown(b.page), b.line, b.text] for b in session]))
    result = subprocess.run(
        [sys.executable, "-c", SESSION, str(script)], cwd=folder, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, f"{session[0].where}: the Python blocks from here failed:\n{result.stderr[-4000:]}"


def _run_shell(block: Block, folder: Path, env: dict[str, str]) -> None:
    result = subprocess.run(
        ["bash", "-eu", "-o", "pipefail", "-c", block.text], cwd=folder, env=env, capture_output=True, text=True
    )
    output = (result.stdout + result.stderr)[-4000:]
    assert result.returncode == 0, f"{block.where}: the shell block failed:\n{output}"


def _path_of(block: Block) -> str | None:
    first = block.text.split("\n", 1)[0]
    match = re.fullmatch(r"# ([\w./-]+\.ya?ml)", first)
    return match.group(1) if match else None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_code_blocks_of_the_page_run(page: Path, tmp_path: Path) -> None:
    run_page(page, tmp_path)


def run_page(page: Path, tmp_path: Path) -> None:
    env = _tools(tmp_path)
    session: list[Block] = []
    for block in blocks(page):
        if block.skipped or block.lang not in RUN:
            continue
        if RUN[block.lang] == "python":
            session.append(block)
            continue
        if RUN[block.lang] == "sh":
            if session:
                _run_python(session, tmp_path, env)
                session = []
            _run_shell(block, tmp_path, env)
        elif (path := _path_of(block)) is not None:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(block.text, encoding="utf-8")
    if session:
        _run_python(session, tmp_path, env)


def test_a_page_runs_in_order_and_a_failing_block_names_its_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```yaml\n# specs/a.yaml\nname: a\n```\n\n"
        "```python\nvalue = 2\n```\n\n"
        "```python\nassert open('specs/a.yaml').read() == '# specs/a.yaml\\nname: a\\n'\nassert value == 2\n```\n\n"
        "<!-- docs-test: skip: never runs -->\n```sh\nexit 1\n```\n\n```text\nnot code\n```\n\n"
        "```sh\ntest -f specs/a.yaml\n```\n\n```python\nvalue\n```\n"
    )
    with pytest.raises(AssertionError, match=r"(?s)page.md:29: the Python blocks from here failed.*line 29.*NameError"):
        run_page(page, tmp_path / "run")


def _specs(page: Path) -> list[Block]:
    return [
        b
        for b in blocks(page)
        if b.lang == "yaml" and not b.skipped and _path_of(b) is None and re.search(r"^name:", b.text, re.MULTILINE)
    ]


@pytest.mark.parametrize("page", [p for p in PAGES if _specs(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_specs_of_the_page_generate(page: Path, tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    for k, block in enumerate(_specs(page)):
        (specs / f"block_{k}.yaml").write_text(block.text, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "opgen", "generate", str(specs), "-o", str(tmp_path / "page_ops")],
        capture_output=True,
        text=True,
        env=_tools(tmp_path),
    )
    assert result.returncode == 0, f"{page.relative_to(ROOT)}: its specs do not generate:\n{result.stderr}"


def test_few_blocks_are_left_out() -> None:
    """A page explains with code that runs; leaving a block out is the exception."""
    left_out = [b.where for page in PAGES for b in blocks(page) if b.skipped or b.lang == "text"]
    pending = sum(1 for page in PAGES for b in blocks(page) if (page.name, _section_of(b)) in NOT_YET_RUN)
    assert len(left_out) - pending <= 12, left_out


def _section_of(block: Block) -> str:
    text = block.page.read_text(encoding="utf-8")
    offset = sum(len(line) + 1 for line in text.split("\n")[: block.line - 1])
    return _section(text, offset) if block.page.parent == ROOT else ""


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def links(page: Path) -> list[tuple[int, str]]:
    """The relative links of a page (outside code blocks), with their line numbers."""
    text = page.read_text(encoding="utf-8")
    blanked = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found = []
    for match in re.finditer(r"\]\(([^)\s]+)\)", blanked):
        target = match.group(1)
        if not re.match(r"[a-z]+:", target):
            found.append((blanked.count("\n", 0, match.start()) + 1, target))
    return found


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for line, target in links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{line}: ({target})"
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(f"{where} is not a file of the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{where}: {resolved.name} has no heading with the anchor #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("See [a](missing.md), [b](https://example.org) and `[c](x)`.\n```sh\n[d](y)\n```\n")
    assert links(page) == [(1, "missing.md"), (1, "x")]


def test_the_readme_is_short() -> None:
    """The README says what opgen is, how to set up and use it, and links to docs/ for the rest."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ours = re.split(r"^## ", readme, flags=re.MULTILINE)
    moving = [s for s in ours if s.split("\n", 1)[0] in {name for _, name in NOT_YET_RUN} | {"Command line"}]
    assert len(readme) - sum(len(s) for s in moving) < 8000
    for page in ("docs/index.md", "docs/tutorial.md", "docs/spec-format.md", "docs/formula-language.md"):
        assert f"]({page}" in readme, f"the README links {page}"


@pytest.mark.parametrize("page", ["spec-format.md", "formula-language.md"])
def test_the_native_whitelist_is_listed_whole(page: str) -> None:
    """The pages list every op `tests.native` takes: both had left out the ones added since (silu, gelu, ...)."""
    from opgen.spec.native import NATIVE_OPS

    text = (ROOT / "docs" / page).read_text()
    listed = re.search(r"`(abs relu [a-z0-9_ ]+)`", text)
    assert listed is not None
    assert listed.group(1).split() == list(NATIVE_OPS)

"""The generation cache (Note [generation cache] in opgen/cache.py): a re-run is served from it,
and whatever the files depend on (the spec, the options, the templates, opgen) makes a new key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT, SPECS, SWISH

from opgen import cache as cache_module
from opgen import pipeline
from opgen.cache import Cache, Entry
from opgen.emit.render import Renderer, default_template_dir
from opgen.pipeline import build

SPEC_NAMES = ("swish.yaml", "softplus.yaml", "safe_sqrt.yaml")


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    folder = tmp_path / "specs"
    folder.mkdir()
    for name in SPEC_NAMES:
        (folder / name).write_text((SPECS / name).read_text(encoding="utf-8"), encoding="utf-8")
    return folder


@pytest.fixture
def generated(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the specs the pipeline generates (rather than takes from the cache), in order."""
    monkeypatch.setenv("OPGEN_JOBS", "1")  # generated here, where the list is, not in worker processes
    names: list[str] = []
    original = pipeline.generate

    def counting(spec, renderer, problems):
        names.append(spec.name)
        return original(spec, renderer, problems)

    monkeypatch.setattr(pipeline, "generate", counting)
    return names


def _build(specs: Path, cache: Cache | None, **options) -> dict[str, str]:
    result = build([str(specs)], Renderer(options.pop("templates", None)), cache=cache, **options)
    assert not result.problems, result.problems.report()
    return result.files


def test_a_second_run_is_served_from_the_cache(specs, tmp_path, generated):
    fresh = _build(specs, None)
    assert len(generated) == 3
    first = _build(specs, Cache(tmp_path / "cache"))
    second = _build(specs, Cache(tmp_path / "cache"))
    # the uncached run, then the first cached one (each in its own order: the largest spec first)
    assert sorted(generated[:3]) == sorted(generated[3:]) == ["safe_sqrt", "softplus", "swish"]
    assert len(generated) == 6
    assert first == second == fresh


def test_a_changed_spec_is_generated_again_and_only_it(specs, tmp_path, generated):
    _build(specs, Cache(tmp_path / "cache"))
    swish = specs / "swish.yaml"
    swish.write_text(swish.read_text(encoding="utf-8").replace("beta: float = 1.0", "beta: float = 2.0"))
    files = _build(specs, Cache(tmp_path / "cache"))
    assert generated[3:] == ["swish"]
    assert "beta: float = 2.0" in files["ops/swish.py"]
    assert files == _build(specs, None)


def test_options_and_templates_are_part_of_the_key(specs, tmp_path, generated):
    _build(specs, Cache(tmp_path / "cache"))
    _build(specs, Cache(tmp_path / "cache"), policy="memory")
    _build(specs, Cache(tmp_path / "cache"), fuse=True)
    assert len(generated) == 9
    templates = tmp_path / "templates"
    templates.mkdir()
    op = (default_template_dir() / "op.py.j2").read_text(encoding="utf-8")
    (templates / "op.py.j2").write_text("# mine\n" + op, encoding="utf-8")
    mine = _build(specs, Cache(tmp_path / "cache", templates), templates=templates)
    # opgen writes the header line itself (Note [generated header]); the template's text follows it.
    assert len(generated) == 12 and mine["ops/swish.py"].split("\n")[1] == "# mine"
    (templates / "op.py.j2").write_text("# changed\n" + op, encoding="utf-8")
    changed = _build(specs, Cache(tmp_path / "cache", templates), templates=templates)
    assert len(generated) == 15 and changed["ops/swish.py"].split("\n")[1] == "# changed"


def test_another_opgen_makes_new_keys(specs, tmp_path, generated, monkeypatch):
    _build(specs, Cache(tmp_path / "cache"))
    real = cache_module._version
    monkeypatch.setattr(cache_module, "_version", lambda name: "9.9" if name == "opgen" else real(name))
    cache_module.generator_digest.cache_clear()
    try:
        _build(specs, Cache(tmp_path / "cache"))
    finally:
        cache_module.generator_digest.cache_clear()
    assert len(generated) == 6


def test_the_generator_digest_covers_opgen_source_and_templates(tmp_path):
    templates, source = tmp_path / "templates", tmp_path / "opgen"
    templates.mkdir()
    source.mkdir()
    (templates / "op.py.j2").write_text("a", encoding="utf-8")
    (source / "derive.py").write_text("a = 1\n", encoding="utf-8")
    digests = {cache_module.generator_digest(templates, source)}
    (templates / "op.py.j2").write_text("b", encoding="utf-8")
    cache_module.generator_digest.cache_clear()
    digests.add(cache_module.generator_digest(templates, source))
    (source / "derive.py").write_text("a = 2\n", encoding="utf-8")
    cache_module.generator_digest.cache_clear()
    digests.add(cache_module.generator_digest(templates, source))
    (source / "derive").mkdir()
    (source / "derive" / "vjp.py").write_text("b = 1\n", encoding="utf-8")  # a module of a stage package
    cache_module.generator_digest.cache_clear()
    digests.add(cache_module.generator_digest(templates, source))
    (source / "notes.txt").write_text("not a module", encoding="utf-8")
    cache_module.generator_digest.cache_clear()
    digests.add(cache_module.generator_digest(templates, source))
    assert len(digests) == 4


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.json"))


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # cut short, as by a crash without the atomic write
        lambda text: "",
        lambda text: "\udcff not text",
        lambda text: json.dumps({**json.loads(text), "key": "0" * 64}),  # another spec's entry
        lambda text: json.dumps({**json.loads(text), "files": {"../outside.py": "import os\n"}}),
        lambda text: json.dumps({**json.loads(text), "shape_checks": "yes"}),
    ],
)
def test_a_damaged_entry_is_ignored_and_rebuilt(tmp_path, damage, generated):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH, encoding="utf-8")
    good = _build(specs, Cache(tmp_path / "cache"))
    (entry,) = _entries(tmp_path / "cache")
    entry.write_text(damage(entry.read_text(encoding="utf-8")), encoding="utf-8", errors="surrogateescape")
    assert _build(specs, Cache(tmp_path / "cache")) == good
    assert generated == ["swish", "swish"]
    assert json.loads(entry.read_text(encoding="utf-8"))["files"] == {k: v for k, v in good.items() if "swish" in k}


def test_a_spec_with_a_problem_is_not_stored(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "bad.yaml").write_text("name: bad\ninputs:\n  x: Tensor\noutputs:\n  y: x / 0\n", encoding="utf-8")
    result = build([str(specs)], Renderer(), cache=Cache(tmp_path / "cache"))
    assert result.problems
    assert _entries(tmp_path / "cache") == []


def test_concurrent_writers_leave_a_whole_entry(tmp_path):
    cache = Cache(tmp_path / "cache")
    entries = [Entry({"ops/op.py": str(k) * 100_000, "tests/test_op.py": ""}, k % 2 == 0) for k in range(8)]
    threads = [threading.Thread(target=cache.put, args=("k" * 64, entry)) for entry in entries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found = cache.get("k" * 64, {"ops/op.py", "tests/test_op.py"})
    assert found in entries
    assert [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()] == ["k" * 64 + ".json"]


def test_old_generators_are_pruned(tmp_path):
    root = tmp_path / "cache"
    for k in range(6):
        old = root / (f"{k}" * 32)
        old.mkdir(parents=True)
        os.utime(old, (k, k))
    Cache(root).put("k" * 64, Entry({}, False))
    kept = sorted(p.name for p in root.iterdir())
    assert len(kept) == cache_module.KEEP and "5" * 32 in kept and "0" * 32 not in kept


def test_an_unwritable_cache_costs_only_speed(specs, tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache folder would be", encoding="utf-8")
    assert _build(specs, Cache(blocker)) == _build(specs, None)


def test_a_rerun_from_the_command_line_never_imports_sympy(specs, tmp_path):
    """What makes an unchanged re-run fast (under half a second here): SymPy is not even imported."""
    environment = {**os.environ, "OPGEN_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    command = ["generate", str(specs), "-o", str(tmp_path / "ops")]
    script = (
        "import sys\nfrom opgen.cli import main\nstatus = main(sys.argv[1:])\n"
        "print(status, sorted(m for m in sys.modules if m.split('.')[0] in ('sympy', 'mpmath', 'torch')))\n"
    )
    first = subprocess.run([sys.executable, "-c", script, *command], env=environment, capture_output=True, text=True)
    assert first.stdout.splitlines()[-1].startswith("0 ['mpmath"), first.stderr
    again = subprocess.run([sys.executable, "-c", script, *command], env=environment, capture_output=True, text=True)
    assert again.stdout.splitlines()[-1] == "0 []", again.stderr
    fresh = [*command, "--no-cache"]
    third = subprocess.run([sys.executable, "-c", script, *fresh], env=environment, capture_output=True, text=True)
    assert third.stdout.splitlines()[-1].startswith("0 ['mpmath"), third.stderr


def test_a_template_in_a_subfolder_is_part_of_the_key(tmp_path):
    templates = tmp_path / "templates"
    (templates / "a").mkdir(parents=True)
    (templates / "b").mkdir()
    (templates / "a" / "part.j2").write_text("x", encoding="utf-8")
    first = Cache(tmp_path / "cache", templates).templates
    (templates / "a" / "part.j2").rename(templates / "b" / "part.j2")
    assert Cache(tmp_path / "cache", templates).templates != first


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_module.default_folder() == tmp_path / "mine"
    monkeypatch.setenv("OPGEN_CACHE_DIR", "")
    assert cache_module.default_folder() is None
    monkeypatch.delenv("OPGEN_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_module.default_folder() == tmp_path / "xdg" / "opgen"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("no home"))))
    assert cache_module.default_folder() is None

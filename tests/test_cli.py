"""The command line: generate, check, the golden `generated/` package, and safe writes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GENERATED, ROOT, SWISH, import_package

from opgen.write import files as write


def write_spec(folder: Path, text: str = SWISH, name: str = "swish.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under `folder` with its text and modification time."""
    return {
        p.relative_to(folder).as_posix(): (p.read_text(encoding="utf-8"), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_generated_matches_specs(golden):
    """The golden record: `generated/` is exactly what `opgen generate specs` writes (the
    comparison `opgen check` makes). Refresh it with `opgen generate specs -o generated`."""
    change, diff = write.check(GENERATED, golden.files)
    assert not change.conflicts
    assert change.clean, f"generated/ is stale; run `opgen generate specs -o generated`\n{diff}"


def test_check_is_clean_on_a_package_just_generated(run_cli, tmp_path):
    specs = tmp_path / "specs"
    write_spec(specs)
    assert run_cli("generate", str(specs), "-o", str(tmp_path / "ops"))[0] == 0
    status, out, _ = run_cli("check", str(specs), "-o", str(tmp_path / "ops"))
    assert status == 0
    assert "up to date (1 ops)" in out


def test_check_reports_a_stale_package_with_a_diff(run_cli, tmp_path):
    specs = tmp_path / "specs"
    spec = write_spec(specs)
    out = tmp_path / "ops"
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    spec.write_text(SWISH.replace("beta: float = 1.0", "beta: float = 2.0"), encoding="utf-8")
    status, diff, err = run_cli("check", str(specs), "-o", str(out), "--diff")
    assert status == 1
    assert "--- a/ops/ops/swish.py" in diff and "+++ b/ops/ops/swish.py" in diff
    assert (
        "-def swish(x: torch.Tensor, beta: float = 1.0)" in diff
        and "+def swish(x: torch.Tensor, beta: float = 2.0)" in diff
    )
    assert "out of date" in err


def test_regenerating_touches_only_changed_files(run_cli, tmp_path):
    specs = tmp_path / "specs"
    write_spec(specs)
    write_spec(specs, SWISH.replace("swish", "swish_two"), "swish_two.yaml")
    out = tmp_path / "ops"
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    before = snapshot(out)
    status, text, _ = run_cli("generate", str(specs), "-o", str(out))
    assert status == 0 and "0 files changed" in text
    assert snapshot(out) == before
    write_spec(specs, SWISH.replace("swish", "swish_two").replace("1.0", "3.0"), "swish_two.yaml")
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    after = snapshot(out)
    changed = sorted(k for k in after if after[k] != before.get(k))
    assert changed == ["ops/swish_two.py", "tests/test_swish_two.py"]


def test_removed_spec_removes_its_generated_files(run_cli, tmp_path):
    specs = tmp_path / "specs"
    write_spec(specs)
    extra = write_spec(specs, SWISH.replace("swish", "swish_two"), "swish_two.yaml")
    out = tmp_path / "ops"
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    extra.unlink()
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    assert not (out / "ops" / "swish_two.py").exists()
    assert "swish_two" not in (out / "__init__.py").read_text()


def test_never_overwrites_a_file_it_did_not_generate(run_cli, tmp_path):
    specs = tmp_path / "specs"
    write_spec(specs)
    out = tmp_path / "ops"
    (out / "ops").mkdir(parents=True)
    mine = out / "ops" / "swish.py"
    mine.write_text("# my own code\n", encoding="utf-8")
    (out / "notes.py").write_text("# also mine\n", encoding="utf-8")
    status, _, err = run_cli("generate", str(specs), "-o", str(out))
    assert status == 2
    assert "ops/swish.py: exists and is not opgen's" in err
    assert mine.read_text() == "# my own code\n"
    assert not (out / "__init__.py").exists()  # nothing at all was written
    assert (out / "notes.py").read_text() == "# also mine\n"


def test_bad_spec_leaves_existing_output_untouched(run_cli, tmp_path):
    specs = tmp_path / "specs"
    spec = write_spec(specs)
    out = tmp_path / "ops"
    assert run_cli("generate", str(specs), "-o", str(out))[0] == 0
    before = snapshot(out)
    spec.write_text(SWISH.replace("exp(-beta * x)", "exp(-beta * q)"), encoding="utf-8")
    status, _, err = run_cli("generate", str(specs), "-o", str(out))
    assert status == 2
    assert f"{spec}:6:" in err and "unknown name 'q'" in err
    assert snapshot(out) == before


def test_missing_spec_and_bad_out_are_clear_errors(run_cli, tmp_path):
    status, _, err = run_cli("generate", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "ops"))
    assert status == 2 and "no such spec file or folder" in err
    spec = write_spec(tmp_path / "specs")
    status, _, err = run_cli("generate", str(spec), "-o", str(tmp_path / "not-a-name"))
    assert status == 2 and "is not a Python identifier" in err


def test_a_pipe_or_a_dangling_link_given_as_spec_is_named_for_what_it_is(run_cli, tmp_path):
    """Reading a pipe would wait for ever; a link to nothing is not a missing file."""
    os.mkfifo(tmp_path / "pipe.yaml")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "gone.yaml")
    status, _, err = run_cli("generate", str(tmp_path / "pipe.yaml"), str(tmp_path / "link.yaml"), "-o", "ops")
    assert status == 2
    assert f"{tmp_path / 'pipe.yaml'}:1:1: not a regular file or a folder" in err
    assert f"{tmp_path / 'link.yaml'}:1:1: a link to nothing ({tmp_path / 'gone.yaml'})" in err


def test_a_pipe_or_a_dangling_link_inside_a_spec_folder_is_reported(run_cli, tmp_path):
    """Named like a spec in a SPEC folder, they were skipped without a word: the spec in them was lost."""
    folder = tmp_path / "specs"
    write_spec(folder)
    os.mkfifo(folder / "pipe.yaml")
    (folder / "link.yaml").symlink_to(tmp_path / "gone.yaml")
    status, _, err = run_cli("generate", str(folder), "-o", str(tmp_path / "ops"))
    assert status == 2
    assert f"{folder / 'pipe.yaml'}:1:1: not a regular file or a folder" in err
    assert f"{folder / 'link.yaml'}:1:1: a link to nothing ({tmp_path / 'gone.yaml'})" in err


def test_output_is_deterministic_across_hash_seeds(tmp_path):
    texts = []
    for seed in ("1", "2"):
        out = tmp_path / f"run{seed}" / "generated"
        subprocess.run(
            [sys.executable, "-m", "opgen", "generate", "specs", "-o", str(out)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        texts.append({k: v[0] for k, v in snapshot(out).items()})
    assert texts[0] == texts[1]


def test_help_lists_both_commands():
    result = subprocess.run([sys.executable, "-m", "opgen", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0
    assert "generate" in result.stdout and "check" in result.stdout


def test_version_is_the_installed_distributions():
    from importlib import metadata

    result = subprocess.run([sys.executable, "-m", "opgen", "--version"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout.strip().startswith(f"opgen {metadata.version('opgen')} (generated code: torch")


def test_user_templates_override_ours_file_by_file(run_cli, tmp_path):
    specs = tmp_path / "specs"
    write_spec(specs)
    templates = tmp_path / "templates"
    templates.mkdir()
    ours = (ROOT / "templates" / "init.py.j2").read_text()
    (templates / "init.py.j2").write_text(ours + "\nCUSTOMISED = True\n")
    out = tmp_path / "ops"
    assert run_cli("generate", str(specs), "-o", str(out), "--templates", str(templates))[0] == 0
    package = import_package(tmp_path, "ops")
    assert package.CUSTOMISED is True
    assert hasattr(package, "SwishFunction")  # the op template is still ours


def test_spec_format_section_1_example(run_cli, tmp_path):
    import torch

    write_spec(tmp_path / "specs")
    assert run_cli("generate", str(tmp_path / "specs"), "-o", str(tmp_path / "generated"))[0] == 0
    package = import_package(tmp_path, "generated")
    x = torch.linspace(-4, 4, 17, dtype=torch.float64, requires_grad=True)
    assert not hasattr(package, "Swish")  # no `module:` section, no Module
    torch.testing.assert_close(package.swish(x, beta=1.5), x * torch.sigmoid(1.5 * x))
    torch.testing.assert_close(package.SwishFunction.apply(x, 1.0), package.swish(x))
    assert torch.autograd.gradgradcheck(lambda t: package.swish(t, 1.5), [x])


def test_installed_wheel_finds_its_templates(tmp_path):
    """A non-editable install, run from another folder, generates with the shipped templates."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    elsewhere = tmp_path / "elsewhere"
    write_spec(elsewhere / "specs")
    result = subprocess.run(
        [sys.executable, "-m", "opgen", "generate", "specs", "-o", "out"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(target), "PATH": ""},
    )
    assert result.returncode == 0, result.stderr
    assert (elsewhere / "out" / "ops" / "swish.py").read_text().startswith("# @generated by opgen")
    assert (target / "opgen" / "templates" / "op.py.j2").is_file()


def test_the_tutorial_shows_the_generated_swish_function():
    readme = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    source = (GENERATED / "ops" / "swish.py").read_text(encoding="utf-8")
    listing = source[re.search(r"^(from|import) ", source, re.M).start() :].rstrip()  # from the imports on
    assert f"```python\n{listing}\n```" in readme, "refresh the swish listing in docs/tutorial.md"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("class", "is a Python keyword"),
        ("None", "is a Python keyword"),
        ("math", "standard library"),
        ("json", "standard library"),
        ("sys", "standard library"),
        ("torch", "a module the generated code imports"),
        ("pytest", "a module the generated code imports"),  # the generated tests import it
        ("numpy", "installed distribution numpy"),
        ("ｔｏｒｃｈ", "is read by Python as 'torch'"),
        ("my-ops", "is not a Python identifier"),
    ],
)
def test_package_names_that_cannot_work_are_refused(run_cli, tmp_path, name, why):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    status, _, err = run_cli("generate", str(specs), "-o", str(tmp_path / name))
    assert status == 2 and why in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["specs"]


@pytest.mark.parametrize(
    "source",
    [
        "import pkg\n",
        "import os, pkg.sub as s\n",
        "import os as o,pkg\n",
        "from pkg import a\n",
        "from \\\n    pkg.sub import (\n    a,\n)\n",
        "import os, \\\n  pkg\n",
        "x = 1; import pkg\n",
        "def f():\n    try:\n        pass\n    finally:\n        import pkg\n",
        "# @generated pkg\n'''pkg'''\nfrom .pkg import x\nimport pkg_two, a.pkg\n",
    ],
)
def test_the_package_name_check_reads_every_import_of_the_name(source):
    """Only files that may import OUT's name are parsed; that must never miss an import."""
    from opgen.write.package_name import imported_modules

    files = {"a.py": "import torch\n", "b.py": source}
    assert ("pkg" in imported_modules(files, "pkg")) == ("pkg" in imported_modules(files))


@pytest.mark.parametrize("name", ["match", "len"])
def test_soft_keywords_and_builtins_are_fine_package_names(run_cli, tmp_path, name):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "swish.yaml").write_text(SWISH)
    assert run_cli("generate", str(specs), "-o", str(tmp_path / name))[0] == 0
    assert import_package(tmp_path, name).swish is not None

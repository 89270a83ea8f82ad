"""`[tool.opgen]` in pyproject.toml, the pre-commit hook and the documented build recipe."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SWISH
from test_cli import snapshot, write_spec

from opgen.commands import config

TANHSHRINK_LET = "name: op\ninputs:\n  x: Tensor\nlet:\n  t: tanh(x)\noutputs:\n  y: x - t\n"
CONFIG = '[project]\nname = "mine"\n\n[tool.opgen]\nspecs = ["specs"]\nout = "ops"\n'


def project(tmp_path: Path, table: str = CONFIG, spec: str = SWISH) -> Path:
    write_spec(tmp_path / "specs", spec)
    (tmp_path / "pyproject.toml").write_text(table, encoding="utf-8")
    return tmp_path


def test_generate_and_check_need_no_arguments_in_a_configured_project(run_cli, tmp_path):
    project(tmp_path)
    status, out, err = run_cli("generate", cwd=tmp_path)
    assert status == 0, err
    assert (tmp_path / "ops" / "ops" / "swish.py").is_file()
    assert run_cli("check")[0] == 0
    write_spec(tmp_path / "specs", SWISH.replace("1.0", "2.0"))
    status, _, err = run_cli("check")
    assert status == 1 and "run `opgen generate`" in err


def test_show_takes_the_specs_of_the_config(run_cli, tmp_path):
    project(tmp_path)
    status, out, err = run_cli("show", cwd=tmp_path)
    assert status == 0, err
    assert out.startswith("swish (specs/swish.yaml)")
    (tmp_path / "pyproject.toml").unlink()
    status, _, err = run_cli("show")
    assert status == 2 and "give SPEC" in err


def test_config_paths_are_relative_to_the_pyproject_from_a_subfolder(run_cli, tmp_path):
    project(tmp_path)
    (tmp_path / "src" / "deep").mkdir(parents=True)
    status, _, err = run_cli("generate", cwd=tmp_path / "src" / "deep")
    assert status == 0, err
    assert (tmp_path / "ops" / "__init__.py").is_file()
    assert not (tmp_path / "src" / "deep" / "ops").exists()


def test_the_nearest_pyproject_with_the_table_wins(run_cli, tmp_path):
    project(tmp_path)
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "other"\n')  # no [tool.opgen]: skipped
    assert run_cli("generate", cwd=inner)[0] == 0
    assert (tmp_path / "ops").is_dir()
    (inner / "pyproject.toml").write_text('[tool.opgen]\nspecs = "../specs"\nout = "here"\n')
    assert run_cli("generate", cwd=inner)[0] == 0
    assert (inner / "here" / "ops" / "swish.py").is_file()


def test_flags_override_the_config(run_cli, tmp_path):
    project(tmp_path, CONFIG + 'policy = "memory"\nfuse = true\n', TANHSHRINK_LET)
    assert run_cli("generate", "-o", "flagged", "--policy", "speed", "--no-fuse", cwd=tmp_path)[0] == 0
    assert not (tmp_path / "ops").exists()
    assert run_cli("generate", "specs", "-o", "configured")[0] == 0  # policy and fuse from the config
    (tmp_path / "pyproject.toml").unlink()
    for policy, fuse, name in (("speed", "--no-fuse", "speed"), ("memory", "--fuse", "memory")):
        assert run_cli("generate", "specs", "-o", name, "--policy", policy, fuse)[0] == 0
    text = {name: snapshot(tmp_path / name)["ops/op.py"][0] for name in ("flagged", "configured", "speed", "memory")}
    assert text["speed"] != text["memory"]
    assert text["flagged"] == text["speed"]
    assert text["configured"] == text["memory"]


def test_templates_from_the_config(run_cli, tmp_path):
    project(tmp_path, CONFIG + 'templates = "my_templates"\n')
    (tmp_path / "my_templates").mkdir()
    ours = (ROOT / "templates" / "init.py.j2").read_text()
    (tmp_path / "my_templates" / "init.py.j2").write_text(ours + "\nCUSTOMISED = True\n")
    assert run_cli("generate", cwd=tmp_path)[0] == 0
    assert "CUSTOMISED = True" in (tmp_path / "ops" / "__init__.py").read_text()


@pytest.mark.parametrize(
    ("line", "where", "message"),
    [
        ('polcy = "speed"', "7:1", "unknown key 'polcy' in [tool.opgen]; did you mean 'policy'?"),
        ('colour = "red"', "7:1", "unknown key 'colour' in [tool.opgen]; the keys are: specs, out"),
        ('policy = "fast"', "7:10", "policy must be one of balanced, memory, speed, not 'fast'"),
        ("fuse = 1", "7:8", "fuse must be true or false"),
        ("form = 3", "7:8", "form must be a non-empty string"),
        ("templates = ''", "7:13", "templates must be a non-empty string"),
        ("fuse = [", "7:9", "invalid TOML"),
    ],
)
def test_a_bad_key_or_value_is_located(run_cli, tmp_path, line, where, message):
    project(tmp_path, CONFIG + line + "\n")
    status, _, err = run_cli("generate", cwd=tmp_path)
    assert status == 2 and "Traceback" not in err
    assert err.startswith(f"pyproject.toml:{where}: "), err
    assert message in err
    assert not (tmp_path / "ops").exists()


def test_bad_specs_value_is_located(run_cli, tmp_path):
    project(tmp_path, CONFIG.replace('specs = ["specs"]', "specs = [1, 2]"))
    status, _, err = run_cli("check", cwd=tmp_path)
    assert status == 2 and err.startswith("pyproject.toml:5:9: specs must be")


def test_without_config_spec_and_out_are_asked_for(run_cli, tmp_path):
    status, _, err = run_cli("generate", cwd=tmp_path)
    assert status == 2 and "give SPEC and -o OUT" in err and "[tool.opgen]" in err
    write_spec(tmp_path / "specs")
    status, _, err = run_cli("check", "specs", cwd=tmp_path)
    assert status == 2 and "give -o OUT" in err


def test_form_is_read_and_handed_on_as_the_flag_is(tmp_path, monkeypatch):
    from opgen import cli

    project(tmp_path, CONFIG + 'form = "custom_op"\n')
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(specs=[], out=None, policy=None, fuse=None, templates=None)
    assert cli._configure(args) is None
    assert args.form == "custom_op" and args.specs == ["specs"] and args.out == "ops"
    args = argparse.Namespace(specs=[], out=None, policy=None, fuse=None, templates=None, form="function")
    cli._configure(args)
    assert args.form == "function"  # the flag wins


def test_without_tomllib_the_message_says_what_to_do(run_cli, tmp_path, monkeypatch):
    project(tmp_path)
    monkeypatch.setattr(config, "_toml", lambda: None)
    status, _, err = run_cli("generate", cwd=tmp_path)
    assert status == 2 and err.startswith("pyproject.toml:1:1: reading it needs Python 3.11 (tomllib)")
    assert "tomli" in err and "pass SPEC and -o" in err


def test_without_tomllib_spec_and_out_on_the_command_line_still_run(run_cli, tmp_path, monkeypatch):
    """Python 3.10 without tomli in a configured project: with SPEC and -o given, generate and check
    run (saying the table was not read); only a run that needs the table stops."""
    project(tmp_path)
    monkeypatch.setattr(config, "_toml", lambda: None)
    status, out, err = run_cli("generate", "specs", "-o", "mine", cwd=tmp_path)
    assert status == 0, err
    assert "pyproject.toml:1:1: warning: [tool.opgen] not read" in err and "1 ops" in out
    assert run_cli("check", "specs", "-o", "mine")[0] == 0
    assert run_cli("check", "-o", "mine")[0] == 2


def test_without_tomllib_the_table_is_read_with_tomli(run_cli, tmp_path, monkeypatch):
    """Python 3.10 has no tomllib; opgen declares tomli for it, and reads the table with that."""
    import tomllib

    project(tmp_path)
    tomli = type(sys)("tomli")
    tomli.loads = tomllib.loads  # type: ignore[attr-defined]
    tomli.TOMLDecodeError = tomllib.TOMLDecodeError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tomllib", None)  # `import tomllib` raises ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "tomli", tomli)
    assert config._toml() is tomli
    status, out, err = run_cli("generate", cwd=tmp_path)
    assert status == 0 and "not read" not in err, err
    assert (tmp_path / "ops" / "ops" / "swish.py").is_file()


def test_the_check_hint_is_the_command_that_fixes_what_was_checked(run_cli, tmp_path):
    """In a configured project, `check SPEC -o OUT` of another package names that package's generate
    (with the options that change what is written), and running the hint makes the check pass."""
    project(tmp_path)
    assert run_cli("generate", "specs", "-o", "other", "--policy", "speed", cwd=tmp_path)[0] == 0
    write_spec(tmp_path / "specs", SWISH.replace("1.0", "2.0"))
    status, _, err = run_cli("check", "specs", "-o", "other", "--policy", "speed", "-q")
    assert status == 1
    hint = re.search(r"run `([^`]*)`; `([^`]*)` shows how", err)
    assert hint and hint[1] == "opgen generate specs -o other --policy speed", err
    assert hint[2] == "opgen check specs -o other --policy speed --diff"
    assert _run(hint[1], tmp_path).returncode == 0
    assert run_cli("check", "specs", "-o", "other", "--policy", "speed")[0] == 0
    assert not (tmp_path / "ops").exists()  # the configured package was never the one to fix


def test_quiet_and_verbose_go_before_the_command_too(run_cli, tmp_path):
    project(tmp_path)
    status, out, err = run_cli("-v", "generate", cwd=tmp_path)
    assert status == 0, err
    assert "using [tool.opgen]" in err and "ops/ops/swish.py: written" in out.replace("\\", "/")
    status, out, err = run_cli("-q", "check")
    assert status == 0 and out == "" and err == ""
    status, _, err = run_cli("-q", "check", "-v")
    assert status == 2 and "not allowed with" in err
    status, _, err = run_cli("-v", "show")
    assert status == 2 and "-v is an option of generate and check only" in err


def test_a_broken_table_header_is_located(run_cli, tmp_path):
    project(tmp_path, CONFIG.replace("[tool.opgen]", "[tool.opgen"))
    status, _, err = run_cli("generate", cwd=tmp_path)
    assert status == 2
    assert err.startswith("pyproject.toml:4:12: invalid TOML: Expected ']'"), err


def test_our_own_project_is_configured():
    found = config.load(ROOT)
    assert found.file == ROOT / "pyproject.toml"
    assert [Path(s).resolve() for s in found.specs or ()] == [ROOT / "specs"]
    assert Path(found.out or "").resolve() == ROOT / "generated"


# -- pre-commit and the build recipe --------------------------------------------------------------


def _run(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A documented command line, with `opgen` and `python` as this test's Python runs them."""
    words = shlex.split(line, comments=True)
    if words[0] == "opgen":
        words = [sys.executable, "-m", "opgen", *words[1:]]
    elif words[0] == "python":
        words = [sys.executable, *words[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPGEN_CACHE_DIR": ""}
    return subprocess.run(words, cwd=cwd, capture_output=True, text=True, env=env)


def test_the_pre_commit_hook_fails_on_a_stale_package_and_passes_after_regenerating(tmp_path):
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (hook,) = [h for h in hooks if h["id"] == "opgen-check"]
    assert hook["pass_filenames"] is False and hook["language"] == "python"
    project(tmp_path)
    assert _run("opgen generate", tmp_path).returncode == 0
    assert _run(hook["entry"], tmp_path).returncode == 0
    write_spec(tmp_path / "specs", SWISH.replace("1.0", "2.0"))
    stale = _run(hook["entry"], tmp_path)
    assert stale.returncode == 1 and "out of date" in stale.stderr
    assert _run("opgen generate", tmp_path).returncode == 0
    assert _run(hook["entry"], tmp_path).returncode == 0


def test_the_documented_build_recipe_runs(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- build recipe: .*?-->\s*```sh\n(.*?)```", readme, re.DOTALL)
    assert block, "the README's build recipe is missing"
    lines = [line.strip() for line in block[1].splitlines() if line.strip()]
    assert lines[0].startswith("python -m pip install")  # opgen is importable here already
    project(tmp_path, CONFIG.replace('out = "ops"', 'out = "generated"'))
    for line in lines[1:]:
        result = _run(line, tmp_path)
        assert result.returncode == 0, (line, result.stdout[-2000:], result.stderr[-2000:])
    assert (tmp_path / "generated" / "ops" / "swish.py").is_file()
    write_spec(tmp_path / "specs", SWISH.replace("1.0", "2.0"))
    assert _run(lines[-1], tmp_path).returncode == 1  # the check catches a stale package


def test_the_ci_example_runs(tmp_path):
    """examples/ci/github-actions.yml, which the README links: each job installs opgen from where the
    project says (the check job without torch, the test job with the `test` extra), and every other
    `run:` line works on a configured project that commits its package; the check job fails on a
    stale one."""
    path = ROOT / "examples" / "ci" / "github-actions.yml"
    assert "(examples/ci/github-actions.yml)" in (ROOT / "README.md").read_text(encoding="utf-8")
    workflow = yaml.safe_load(path.read_text(encoding="utf-8"))
    project(tmp_path, CONFIG.replace('out = "ops"', 'out = "generated"'))
    assert _run("opgen generate", tmp_path).returncode == 0  # the committed package
    installs = {}
    for name, job in workflow["jobs"].items():
        assert {step["uses"].split("@")[0] for step in job["steps"] if "uses" in step} == {
            "actions/checkout",
            "actions/setup-python",
        }
        install, *lines = [step["run"] for step in job["steps"] if "run" in step]
        installs[name] = install
        for line in lines:
            result = _run(line, tmp_path)
            assert result.returncode == 0, (name, line, result.stdout[-2000:], result.stderr[-2000:])
    assert installs == {
        "check": 'python -m pip install "opgen @ ${{ vars.OPGEN_SOURCE }}"',
        "test": 'python -m pip install "opgen[test] @ ${{ vars.OPGEN_SOURCE }}"',
    }
    write_spec(tmp_path / "specs", SWISH.replace("1.0", "2.0"))
    stale = _run("opgen check --diff", tmp_path)
    assert stale.returncode == 1 and "+++ " in stale.stdout

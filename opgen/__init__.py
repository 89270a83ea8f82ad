"""opgen: custom PyTorch autograd ops from YAML specs."""

__version__ = "0.1.0"  # the same as pyproject.toml's (tests/test_versions.py)
# The torch releases generated code supports and CI tests (the floor by scripts/test-floor.sh, the
# top by scripts/test.sh), as pyproject.toml's extras declare it (tests/test_versions.py).
TORCH_REQUIREMENT = "torch>=2.7,<2.14"


def install_hint(extra: str) -> str:
    """How to install opgen with `extra`, as every hint says it. opgen is not on a package index:
    it is installed from a clone (or a wheel built from one, or its repository's URL), so no hint
    installs it by name (tests/test_install.py)."""
    return f'`python -m pip install "path/to/opgen[{extra}]"` (your clone of opgen; a wheel or VCS URL works the same)'

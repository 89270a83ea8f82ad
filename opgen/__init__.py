"""opgen: custom PyTorch autograd ops from YAML specs."""

__version__ = "0.1.0"  # the same as pyproject.toml's (tests/test_versions.py)
# The torch releases generated code supports, as pyproject.toml declares it (tests/test_versions.py).
TORCH_REQUIREMENT = "torch>=2.4,<3"

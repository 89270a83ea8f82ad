"""Modules copied as they are into generated packages: `tests/harness.py` (the checks the
generated tests share), `_shape_checks.py` (call-time checks of named dimensions) and, where an
op has the custom_op form, `_custom_ops.py` (its torch.library registration).

They are real source here, linted and type-checked with the rest of opgen; generation adds the
`@generated` marker line and nothing else (`opgen.emit.render.Renderer.runtime`). No stage
imports them: they run inside the generated package, which depends on torch alone.
"""

"""Modules copied as they are into every generated package: `tests/harness.py` (the checks the
generated tests share) and `_shape_checks.py` (call-time checks of named dimensions).

They are real source here, linted and type-checked with the rest of opgen; generation adds the
`@generated` marker line and nothing else (`opgen.emit.render.Renderer.runtime`). No stage
imports them: they run inside the generated package, which depends on torch alone.
"""

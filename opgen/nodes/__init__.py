"""Node families: each SymPy node opgen defines, with all its rules side by side (Note [nodes] in `base`).

Not a stage: every stage may import these modules, and they import no stage but `opgen.formula`
(see `tests/test_pipeline.py`). `base` declares what a stage may ask of a node; each other module
is one family: its node classes, their shapes, gradients, formulas, and how they print.
"""

"""Spec YAML is read by libyaml where PyYAML has it (Note [libyaml events] in opgen/spec/load.py):
the same located tree, or the same located error, as PyYAML's own reader gives, for every spec of
the project and for thousands of mutations of them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from opgen.errors import SpecError
from opgen.spec import load

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [p.read_text(encoding="utf-8") for p in sorted({*ROOT.glob("specs/*.yaml"), *ROOT.glob("tests/**/*.yaml")})]
# Characters that YAML gives a meaning, the line breaks and marks that PyYAML and libyaml read apart, others.
ALPHABET = " \t\n\r\x0b\x85\u2028\u2029\ufeff\x00:-[]{}(),'\"#&*!|>?%@`\\09az.é中\U0001f600"

pytestmark = pytest.mark.skipif(load._CParser is None, reason="PyYAML without libyaml reads every spec itself")


def _read(text: str, fast: bool) -> tuple[str, object]:
    saved = load._CParser
    load._CParser = saved if fast else None
    try:
        return "tree", load.load_text(text, "spec.yaml")
    except SpecError as error:
        return "error", str(error)
    finally:
        load._CParser = saved


def _mutated(rng: random.Random) -> str:
    chars = list(rng.choice(TEXTS))
    for _ in range(rng.randint(1, 4)):
        k = rng.randrange(len(chars) + 1)
        roll = rng.random()
        if roll < 0.4:
            chars.insert(k, rng.choice(ALPHABET))
        elif chars and roll < 0.7:
            del chars[min(k, len(chars) - 1)]
        elif chars:
            chars[min(k, len(chars) - 1)] = rng.choice(ALPHABET)
    return "".join(chars)


def test_the_projects_specs_read_alike_both_ways() -> None:
    assert TEXTS
    for text in TEXTS:
        assert _read(text, fast=True) == _read(text, fast=False)


@pytest.mark.parametrize("seed", range(4))
def test_mutated_specs_read_alike_both_ways(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        text = _mutated(rng)
        assert _read(text, fast=True) == _read(text, fast=False), repr(text)


@pytest.mark.parametrize(
    "text",
    [
        "name: a\tb\n",  # libyaml takes a tab inside a plain scalar
        "a: {b: c?}\n",  # PyYAML ends a plain scalar of a flow collection at `?`
        "a: {b: ,c}\n",  # where the empty value is
        "? a\n",  # a complex key
        "doc: |#\n  x\n",  # a block scalar's header
        "a: !tag b\n",
        "a:\r\n  b\n",
    ],
)
def test_text_libyaml_reads_otherwise_goes_to_pyyaml(text: str) -> None:
    assert load._DIFFERENT.search(text)
    assert _read(text, fast=True) == _read(text, fast=False)


def test_plain_specs_take_the_fast_reader() -> None:
    fast = [text for text in TEXTS[:60] if not load._DIFFERENT.search(text)]
    assert len(fast) > 30  # `Tensor?`, `x > 0`, `{shape: [D]}` and the like do not send a spec to PyYAML

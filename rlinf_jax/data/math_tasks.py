"""Procedural arithmetic problems, so the default reasoning recipe needs no data files.

Five difficulty levels (``LEVELS``); every example is a pure function of (seed, split, index),
so a dataset of any size is random access and a run can resume from an index.

Train and held-out splits never share a problem. Each problem has a canonical key (its level
and arithmetic content: the expression, or a word problem's template and numbers, not the
names and items dressed around them). A stable hash of the key puts it in the held-out part of
the problem space when it falls below ``heldout_fraction`` and in the train part otherwise; a
split only keeps draws from its own part. So no held-out problem (nor its prompt and answer) can
appear in train, whatever the seeds and sizes. On top of that the splits draw from separate
seed streams (``numpy`` ``SeedSequence`` entropy ``(seed, split_stream, index)``), so they are
independent samples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from rlinf_jax.errors import BadInput

LEVELS = {
    1: "single-digit addition",
    2: "two-digit addition and subtraction",
    3: "three-digit addition and subtraction, two-digit by one- or two-digit multiplication",
    4: "multi-step expressions with parentheses (3-4 operands in 1..20; + - *)",
    5: "word problems (one or two steps; + - * and exact division)",
}
SPLITS = {"train": 0, "heldout": 1}
_MAX_DRAWS = 10_000

_NAMES = ("Alice", "Ben", "Chloe", "David", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jamal", "Kenji", "Lena")
_ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def heldout_bucket(key: str) -> float:
    """A stable pseudo-uniform number in [0, 1) for a problem key (blake2b, not ``hash()``,
    which Python salts per process)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _int(rng, lo, hi):
    """Uniform integer in [lo, hi]."""
    return int(rng.integers(lo, hi + 1))


def _binary(rng, level, a, b, op):
    if op == "-" and a < b:
        a, b = b, a  # keep two-operand subtraction non-negative
    expr = f"{a} {op} {b}"
    return f"{level}:{expr}", f"What is {expr}?", _OPS[op](a, b)


def _expression(rng, n):
    """A random binary tree over ``n`` operands; returns (text, value). Every inner node below
    the root is parenthesised, so the text reads the same under any precedence convention."""
    if n == 1:
        v = _int(rng, 1, 20)
        return str(v), v
    left_n = _int(rng, 1, n - 1)
    lt, lv = _expression(rng, left_n)
    rt, rv = _expression(rng, n - left_n)
    op = "+-*"[_int(rng, 0, 2)]
    lt = f"({lt})" if left_n > 1 else lt
    rt = f"({rt})" if n - left_n > 1 else rt
    return f"{lt} {op} {rt}", _OPS[op](lv, rv)


def _word_problem(rng):
    name, other = (str(x) for x in rng.choice(_NAMES, size=2, replace=False))
    item = str(rng.choice(_ITEMS))
    kind = _int(rng, 0, 4)
    if kind == 0:
        a, b = _int(rng, 2, 50), _int(rng, 2, 50)
        text = f"{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?"
        nums, ans = (a, b), a + b
    elif kind == 1:
        a = _int(rng, 3, 50)
        b = _int(rng, 1, a - 1)
        text = f"{name} has {a} {item} and gives {b} to {other}. How many {item} does {name} have left?"
        nums, ans = (a, b), a - b
    elif kind == 2:
        a, b = _int(rng, 2, 9), _int(rng, 2, 12)
        text = f"{name} buys {a} bags with {b} {item} in each bag. How many {item} does {name} have in total?"
        nums, ans = (a, b), a * b
    elif kind == 3:
        a, b = _int(rng, 2, 40), _int(rng, 2, 40)
        c = _int(rng, 1, a + b - 1)
        text = (
            f"{name} has {a} {item}, buys {b} more and then gives {c} to {other}. "
            f"How many {item} does {name} have now?"
        )
        nums, ans = (a, b, c), a + b - c
    else:
        each, friends = _int(rng, 2, 12), _int(rng, 2, 9)
        total = each * friends
        text = f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?"
        nums, ans = (total, friends), each
    return f"5:w{kind}:" + ",".join(map(str, nums)), text, ans


def make_problem(level: int, rng: np.random.Generator) -> tuple[str, str, int]:
    """One problem of ``level`` drawn from ``rng``: ``(key, prompt, integer answer)``."""
    if level == 1:
        return _binary(rng, 1, _int(rng, 0, 9), _int(rng, 0, 9), "+")
    if level == 2:
        return _binary(rng, 2, _int(rng, 10, 99), _int(rng, 10, 99), "+-"[_int(rng, 0, 1)])
    if level == 3:
        op = "+-*"[_int(rng, 0, 2)]
        if op == "*":
            return _binary(rng, 3, _int(rng, 10, 99), _int(rng, 2, 19), op)
        return _binary(rng, 3, _int(rng, 100, 999), _int(rng, 100, 999), op)
    if level == 4:
        text, value = _expression(rng, _int(rng, 3, 4))
        return f"4:{text}", f"What is {text}?", value
    if level == 5:
        return _word_problem(rng)
    raise BadInput(f"math task level {level} does not exist; use levels among {sorted(LEVELS)}")


def check_levels(levels, known=LEVELS, kind: str = "math") -> tuple[int, ...]:
    """``levels`` as ints when they are a non-empty subset of ``known`` (a ``kind`` task's levels)."""
    levels = tuple(int(x) for x in levels)
    if not levels or any(x not in known for x in levels):
        raise BadInput(f"{kind} task levels {list(levels)} are invalid; pick a non-empty subset of {sorted(known)}")
    return levels


class MathTaskGenerator:
    """Examples ``{"prompt", "answer", "level", "id"}`` of one split, indexed from 0.

    ``example(i)`` depends only on (seed, split, levels, heldout_fraction, i). The level of
    each example is drawn uniformly from ``levels``.
    """

    def __init__(self, levels=(1,), split: str = "train", seed: int = 0, heldout_fraction: float = 0.2):
        if split not in SPLITS:
            raise BadInput(f"math task split {split!r} is unknown; use one of {sorted(SPLITS)}")
        if not 0.0 < heldout_fraction < 1.0:
            raise BadInput(f"heldout_fraction={heldout_fraction} must lie strictly between 0 and 1")
        self.levels = check_levels(levels)
        self.split = split
        self.seed = int(seed)
        self.heldout_fraction = float(heldout_fraction)

    def in_split(self, key: str) -> bool:
        held = heldout_bucket(key) < self.heldout_fraction
        return held if self.split == "heldout" else not held

    def example(self, index: int) -> dict:
        if index < 0:
            raise IndexError(index)
        rng = np.random.default_rng([self.seed, SPLITS[self.split], int(index)])
        level = self.levels[_int(rng, 0, len(self.levels) - 1)]
        for _ in range(_MAX_DRAWS):
            key, prompt, answer = make_problem(level, rng)
            if self.in_split(key):
                return {"prompt": prompt, "answer": str(answer), "level": level, "id": f"{self.split}-{self.seed}-{index}"}
        raise RuntimeError(f"no {self.split} problem of level {level} in {_MAX_DRAWS} draws")  # pragma: no cover

    def take(self, n: int, start: int = 0) -> list[dict]:
        return [self.example(i) for i in range(start, start + n)]


class GeneratedDataset(Sequence):
    """A random-access dataset of ``size`` examples, each a pure function of its index:
    subclasses set ``size`` and define ``example(index)``; indexing, negative indices and
    slices are this class's."""

    size: int

    def example(self, index: int) -> dict:
        raise NotImplementedError

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        index = int(index)
        if index < 0:
            index += self.size
        if not 0 <= index < self.size:
            raise IndexError(index)
        return self.example(index)


class ProceduralMathDataset(GeneratedDataset):
    """``size`` examples of a ``MathTaskGenerator``, as a random-access dataset."""

    def __init__(self, size: int, levels=(1,), split: str = "train", seed: int = 0, heldout_fraction: float = 0.2):
        if size <= 0:
            raise BadInput(f"procedural math dataset size {size} must be positive")
        self.generator = MathTaskGenerator(levels, split, seed, heldout_fraction)
        self.size = int(size)

    def example(self, index: int) -> dict:
        return self.generator.example(index)

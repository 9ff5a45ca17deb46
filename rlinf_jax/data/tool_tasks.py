"""Procedural calculator problems: arithmetic a tiny model cannot do in its head but can with
a calculator, and transcripts of solving them with one (SFT warm starts of tool use).

Levels (``TOOL_LEVELS``):

1. two-digit by two-digit multiplication ("What is 47 * 86?")
2. three-digit by two- or three-digit multiplication
3. two-step word arithmetic: a product, then an amount added or taken away

Every example is a pure function of (seed, split, index), and the held-out split is kept
apart as in `rlinf_jax.data.math_tasks`: a problem's canonical key (level and numbers) is
hashed, and each split only keeps draws from its own part of the problem space.

A transcript is the model's side of a solved episode in the tool syntax of
`rlinf_jax.agents.syntax` (which this module does not import: data is a leaf), e.g.::

    <tool>calculator: 47*86</tool><result>4042</result>\\boxed{4042}

(level 3 calls the calculator twice). The ``<result>`` parts are what the environment
writes; in a rollout they are observations, in SFT they are part of the target text.
"""

from __future__ import annotations


import numpy as np

from rlinf_jax.data.math_tasks import SPLITS, GeneratedDataset, check_levels, heldout_bucket
from rlinf_jax.errors import BadInput

TOOL_LEVELS = {
    1: "two-digit by two-digit multiplication",
    2: "three-digit by two- or three-digit multiplication",
    3: "two-step word arithmetic (a product, then + or -)",
}
_NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo")
_ITEMS = ("pens", "cards", "coins", "books", "shells", "stamps")
_MAX_DRAWS = 10_000


def _call(expr: str, value: int) -> str:
    return f"<tool>calculator: {expr}</tool><result>{value}</result>"


def make_tool_problem(level: int, rng: np.random.Generator) -> dict:
    """``{"key", "prompt", "answer", "target"}`` of one problem of ``level``."""
    if level in (1, 2):
        if level == 1:
            a, b = int(rng.integers(10, 100)), int(rng.integers(10, 100))
        else:
            a, b = int(rng.integers(100, 1000)), int(rng.integers(10, 1000))
        ans = a * b
        return {"key": f"t{level}:{a}*{b}", "prompt": f"What is {a} * {b}?", "answer": str(ans),
                "target": _call(f"{a}*{b}", ans) + f"\\boxed{{{ans}}}"}
    if level == 3:
        name = _NAMES[int(rng.integers(len(_NAMES)))]
        item = _ITEMS[int(rng.integers(len(_ITEMS)))]
        boxes, each = int(rng.integers(11, 100)), int(rng.integers(11, 100))
        product = boxes * each
        if rng.integers(2):
            extra = int(rng.integers(100, 1000))
            ans, op = product + extra, "+"
            text = f"{name} has {boxes} boxes of {each} {item} and finds {extra} more. How many {item}?"
        else:
            extra = int(rng.integers(100, product))
            ans, op = product - extra, "-"
            text = f"{name} has {boxes} boxes of {each} {item} and gives away {extra}. How many {item} are left?"
        target = _call(f"{boxes}*{each}", product) + _call(f"{product}{op}{extra}", ans) + f"\\boxed{{{ans}}}"
        return {"key": f"t3:{boxes}*{each}{op}{extra}", "prompt": text, "answer": str(ans), "target": target}
    raise BadInput(f"tool task level {level} does not exist; use levels among {sorted(TOOL_LEVELS)}")


def check_tool_levels(levels) -> tuple[int, ...]:
    return check_levels(levels, TOOL_LEVELS, "tool")


class ToolTaskDataset(GeneratedDataset):
    """``size`` examples ``{"prompt", "answer", "target", "level", "id"}`` of one split.

    ``transcripts=False`` leaves ``target`` out (an SFT on it then learns the bare
    ``\\boxed{answer}``, the no-tool control). ``tool_fraction`` < 1 keeps the transcript
    on that share of the examples only (a draw of its own per index, so the problems are
    the same at every fraction): the rest answer directly, and a warm start on them calls
    the calculator on some prompts and guesses on others.
    """

    def __init__(self, size: int, levels=(1,), split: str = "train", seed: int = 0, heldout_fraction: float = 0.2,
                 transcripts: bool = True, tool_fraction: float = 1.0):
        if split not in SPLITS:
            raise BadInput(f"tool task split {split!r} is unknown; use one of {sorted(SPLITS)}")
        if size <= 0:
            raise BadInput(f"tool task dataset size {size} must be positive")
        if not 0.0 <= tool_fraction <= 1.0:
            raise BadInput(f"tool task tool_fraction={tool_fraction} must lie between 0 and 1")
        self.levels = check_tool_levels(levels)
        self.size, self.split, self.seed = int(size), split, int(seed)
        self.heldout_fraction, self.transcripts = float(heldout_fraction), bool(transcripts)
        self.tool_fraction = float(tool_fraction)

    def example(self, index: int) -> dict:
        rng = np.random.default_rng([self.seed, 7, SPLITS[self.split], int(index)])
        level = self.levels[int(rng.integers(len(self.levels)))]
        for _ in range(_MAX_DRAWS):
            p = make_tool_problem(level, rng)
            held = heldout_bucket(p["key"]) < self.heldout_fraction
            if held == (self.split == "heldout"):
                rec = {"prompt": p["prompt"], "answer": p["answer"], "level": level,
                       "id": f"tool-{self.split}-{self.seed}-{index}"}
                if self.transcripts and self._uses_tool(index):
                    rec["target"] = p["target"]
                return rec
        raise RuntimeError(f"no {self.split} tool problem of level {level} in {_MAX_DRAWS} draws")  # pragma: no cover

    def _uses_tool(self, index: int) -> bool:
        if self.tool_fraction >= 1.0:
            return True
        return float(np.random.default_rng([self.seed, 11, SPLITS[self.split], int(index)]).random()) < self.tool_fraction

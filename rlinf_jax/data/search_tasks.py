"""Procedural look-up questions whose facts live only in a local document collection: the
search tool's task (``data.source: tool_search``, ``agent.search_documents: facts``).

A fixed universe of invented towns (names built from syllables, so no model knows them),
each with three numeric facts, is a pure function of ``FACTS_SEED``. The collection holds
one short document per fact (``"Kalomir population 48213"``); a question asks for one fact
("What is the population of Kalomir?") and its answer is the number. A model can only
answer by searching for the town and copying the number from the result::

    <tool>search: Kalomir population</tool><result>Kalomir population 48213</result>\\boxed{48213}

The held-out split asks about towns that no train question mentions (a town's name is
hashed, as the math tasks' problems are), so a policy that scores there has learnt to use
the tool, not the facts. Write the collection out to read it:
``python -m rlinf_jax.data.search_tasks facts.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from rlinf_jax.data.math_tasks import SPLITS, GeneratedDataset, heldout_bucket
from rlinf_jax.errors import BadInput

FACTS_SEED = 0
NUM_TOWNS = 2000
_SYLLABLES = ("ka", "lo", "mir", "ren", "tu", "vor", "zan", "qui", "pel", "dor", "sa", "nek", "bri", "tol",
              "fen", "gar", "hus", "jin", "mo", "wex")
# attribute -> (question, value range)
ATTRIBUTES = {
    "population": ("What is the population of {town}?", (1000, 100_000)),
    "founded": ("In which year was {town} founded?", (1100, 2000)),
    "elevation": ("How high above the sea is {town}, in metres?", (10, 4000)),
}
_MAX_DRAWS = 10_000


@lru_cache(maxsize=4)
def towns(seed: int = FACTS_SEED) -> tuple[tuple[str, dict[str, int]], ...]:
    """``NUM_TOWNS`` distinct ``(name, {attribute: value})``, the same for a seed everywhere."""
    rng = np.random.default_rng([seed, 13])
    names: dict[str, None] = {}
    while len(names) < NUM_TOWNS:
        parts = rng.integers(len(_SYLLABLES), size=int(rng.integers(2, 4)))
        names.setdefault("".join(_SYLLABLES[i] for i in parts).capitalize())
    return tuple(
        (name, {a: int(rng.integers(lo, hi)) for a, (_, (lo, hi)) in ATTRIBUTES.items()}) for name in names
    )


def fact_text(town: str, attribute: str, value: int) -> str:
    return f"{town} {attribute} {value}"


def fact_documents(seed: int = FACTS_SEED) -> list[str]:
    """The collection: one document per fact of every town (train and held-out towns alike)."""
    return [fact_text(t, a, v) for t, facts in towns(seed) for a, v in facts.items()]


class ToolSearchDataset(GeneratedDataset):
    """``size`` questions ``{"prompt", "answer", "target", "id"}`` of one split; ``seed``
    draws the questions, the towns are `towns()`'s. ``transcripts=False`` leaves ``target``
    out (SFT on the bare ``\\boxed{answer}``: the no-tool control)."""

    def __init__(self, size: int, split: str = "train", seed: int = 0, heldout_fraction: float = 0.2,
                 transcripts: bool = True):
        if split not in SPLITS:
            raise BadInput(f"search task split {split!r} is unknown; use one of {sorted(SPLITS)}")
        if size <= 0:
            raise BadInput(f"search task dataset size {size} must be positive")
        self.size, self.split, self.seed = int(size), split, int(seed)
        self.heldout_fraction, self.transcripts = float(heldout_fraction), bool(transcripts)

    def example(self, index: int) -> dict:
        rng = np.random.default_rng([self.seed, 17, SPLITS[self.split], int(index)])
        universe = towns()
        for _ in range(_MAX_DRAWS):
            town, facts = universe[int(rng.integers(len(universe)))]
            if (heldout_bucket(f"s:{town}") < self.heldout_fraction) != (self.split == "heldout"):
                continue
            attribute = list(ATTRIBUTES)[int(rng.integers(len(ATTRIBUTES)))]
            value = facts[attribute]
            rec = {"prompt": ATTRIBUTES[attribute][0].format(town=town), "answer": str(value),
                   "id": f"search-{self.split}-{self.seed}-{index}"}
            if self.transcripts:
                rec["target"] = (f"<tool>search: {town} {attribute}</tool><result>{fact_text(town, attribute, value)}"
                                 f"</result>\\boxed{{{value}}}")
            return rec
        raise RuntimeError(f"no {self.split} town in {_MAX_DRAWS} draws")  # pragma: no cover


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlinf_jax.data.search_tasks",
                                description="Write the search task's fact collection as a .jsonl file.")
    p.add_argument("out", type=Path, help="the .jsonl file to write (refused if it exists)")
    args = p.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists; choose a new file name", file=sys.stderr)
        return 2
    docs = fact_documents()
    args.out.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    print(f"{len(docs)} documents -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

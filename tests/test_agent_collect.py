"""Statistics an agentic run logs to explain its learning: accuracy per level of the
held-out episodes."""

from __future__ import annotations

import numpy as np

from rlinf_jax.tasks.reasoning.agent_collect import level_accuracy


def test_level_accuracy_splits_by_level():
    correct = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    levels = [1, 1, 2, 2, 3, 1]
    assert level_accuracy(correct, levels, "eval/accuracy") == {
        "eval/accuracy_level1": 1 / 3, "eval/accuracy_level2": 1.0, "eval/accuracy_level3": 0.0,
    }


def test_level_accuracy_is_empty_without_levels():
    correct = np.array([1.0, 0.0])
    assert level_accuracy(correct, [None, None], "eval/accuracy") == {}
    assert level_accuracy(correct, [2, 2], "eval/accuracy") == {}  # one level: the total says it
    assert level_accuracy(correct, ["a", "b"], "eval/accuracy") == {}

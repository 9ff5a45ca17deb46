"""benchmarks/flow_sampled_eval.py's paired comparison of two policies on the same episodes,
against differences worked by hand."""

from __future__ import annotations

import math
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from flow_sampled_eval import paired_difference  # noqa: E402


def test_paired_difference_on_hand_examples():
    # d = [0, 1, 0, -1]: mean 0, sample variance 2/3, so se = sqrt(2/3) / 2.
    out = paired_difference([1, 0, 0, 1], [1, 1, 0, 0])
    assert out["difference"] == 0.0
    assert out["se"] == pytest.approx(math.sqrt(2 / 3) / 2)
    assert (out["gained"], out["lost"]) == (1, 1)
    # d = [1, 1, 0, 0, 0]: mean 0.4, deviations 0.6, 0.6, -0.4 x3: variance 1.2 / 4.
    out = paired_difference([0, 0, 0, 0, 1], [1, 1, 0, 0, 1])
    assert out["difference"] == pytest.approx(0.4)
    assert out["se"] == pytest.approx(math.sqrt(0.3 / 5))
    assert (out["gained"], out["lost"]) == (2, 0)
    # Sharing the episodes makes it tighter than two independent evaluations' error.
    independent = math.sqrt(0.2 * 0.8 / 5 + 0.6 * 0.4 / 5)
    assert out["se"] < independent


def test_paired_difference_refuses_unequal_evaluations():
    with pytest.raises(ValueError, match="equal 1-D"):
        paired_difference([1, 0, 1], [1, 0])

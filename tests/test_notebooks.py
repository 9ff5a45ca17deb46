"""Notebooks run top to bottom on their tiny settings (code cells executed in order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path):
    nb = json.loads(path.read_text())
    scope: dict = {"__name__": "__notebook__"}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        assert "TINY = False" not in source, "notebooks are tested on their tiny settings"
        exec(compile(source, f"{path.name}[cell {i}]", "exec"), scope)
    # What the quickstart shows, checked: the run did its iterations, logged an evaluation
    # at the end, and its checkpoint gives that evaluation again.
    summary, records = scope["summary"], scope["records"]
    assert summary.steps == scope["cfg"].runner.max_steps == records[-1]["step"]
    assert records[-1]["eval/return"] == pytest.approx(summary.eval_return)
    assert 0.0 < summary.eval_return <= 1000.0  # inverted_pendulum: one reward per upright step
    assert float(scope["again"]["eval/return"]) == pytest.approx(summary.eval_return, rel=1e-5)

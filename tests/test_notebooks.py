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
    assert scope["summary"].eval_return is not None

"""Every notebook runs top to bottom in a real Jupyter kernel (nbclient) on its TINY settings,
and what it shows is checked: the values it prints, the figures it draws.

A check cell is appended to the notebook in memory (never to the file) and prints the
notebook's own variables as JSON; the committed files carry no outputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MARK = "NOTEBOOK-CHECK "
STACKS_AFTER_S = 600  # under the suite's 900 s per test; a notebook takes 1-5 minutes


def _outputs(nb, kind: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == kind]


def execute(name: str, cwd: Path, check: str, timeout: int = 900) -> tuple[nbformat.NotebookNode, dict]:
    """Runs notebook ``name`` in a fresh kernel in ``cwd`` with the expression ``check`` (a
    dict of the notebook's values) evaluated last; returns the executed notebook and it."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        assert not cell.get("outputs") and cell.get("execution_count") is None, f"{name}: outputs are committed"
    nb.cells.append(nbformat.v4.new_code_cell(f"import json as _json\nprint({MARK!r} + _json.dumps({check}))"))
    # A kernel that hangs explains itself: still running after STACKS_AFTER_S, it writes every
    # thread's stack to a file, which the failure (a cell's or the test's timeout) then shows.
    stacks = cwd / "kernel_stacks.txt"
    nb.cells.insert(0, nbformat.v4.new_code_cell(
        f"import faulthandler as _fh\n_fh_file = open({str(stacks)!r}, 'w')\n"
        f"_fh.dump_traceback_later({STACKS_AFTER_S}, file=_fh_file)"))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    try:
        client.execute()
    except BaseException:  # pytest-timeout's failure included: it is raised in this thread
        dumped = stacks.read_text() if stacks.is_file() else ""
        if dumped:
            print(f"{name}: the kernel's threads after {STACKS_AFTER_S} s:\n{dumped}", file=sys.stderr)
        raise
    text = "".join(o.get("text", "") for o in _outputs(nb, "stream") if o.get("name") == "stdout")
    line = next(ln for ln in text.splitlines() if ln.startswith(MARK))
    stderr = "".join(o.get("text", "") for o in _outputs(nb, "stream") if o.get("name") == "stderr")
    assert "Traceback" not in stderr and "ipywidgets" not in stderr, stderr[-2000:]
    return nb, json.loads(line[len(MARK):])


def figures(nb) -> int:
    return sum("image/png" in o.get("data", {}) for o in _outputs(nb, "display_data"))


def test_every_notebook_is_tested_and_starts_with_the_setup_cell():
    tested = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert tested == set(CHECKS), "a notebook without a test here, or a test without its notebook"
    for name in tested:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        setup = next(c for c in nb.cells if c.cell_type == "code").source
        assert "pip\", \"install\"" in setup and "TINY = backend == \"cpu\"" in setup, name
        assert "rlinf_jax." not in "".join(c.source for c in nb.cells if c.cell_type == "code").replace(
            "rlinf_jax.errors", ""), f"{name} reaches past the public API"


def _control(nb, got):
    assert figures(nb) >= 2  # the PPO curve, PPO against SAC
    assert got["ppo_steps"] == 8 and got["sac_steps"] == 24
    # The saved run evaluates, its policy acts on the run's envs.
    assert got["report_step"] == 8 and got["report_return"] > 0
    assert got["actions"] == [32, 1]
    # SAC learns on its tiny settings (see tests/test_offpolicy.py for the margin).
    assert got["sac_first"] < 40 and got["sac_best"] > 100


def _placement(nb, got):
    assert figures(nb) >= 1  # throughput by layout
    assert got["runners"] == {"collocated": "Fused", "disaggregated": "Staged", "hybrid": "Staged"}
    assert all(got["requested"][m] == m for m in got["requested"])
    env, actor = got["disaggregated_devices"]["env"], got["disaggregated_devices"]["actor"]
    assert env and actor and not set(env) & set(actor)
    # The same numbers in every layout (docs/placement.md's tolerance on the first row).
    assert max(got["worst"].values()) < 1e-3, got["worst"]


def _reasoning(nb, got):
    assert figures(nb) >= 1  # the accuracy curve
    assert got["steps"] == 16 and got["answers"] == 8 and got["warm_start"].endswith("/sft")
    # The notebook's pass@1 of the final checkpoint is the run's own last evaluation.
    assert got["pass1"] == pytest.approx(got["final_accuracy"])
    assert got["accuracy"][0] > 0.1, got["accuracy"]  # the warm start has taught the answer format


def _own(nb, got):
    assert figures(nb) >= 1
    assert got["model_type"] == "qwen2" and got["params"] > 0
    assert got["grpo_steps"] == 8
    # SFT on the user's file teaches the random model the sums (see the notebook's settings).
    assert got["sft_accuracy"][-1] > got["sft_accuracy"][0] + 0.4, got["sft_accuracy"]
    assert len(got["answers"]) == 2


def _vla(nb, got):
    assert figures(nb) >= 3  # the scenes, the success curves and bars, the episode strip
    assert got["scene"] == [4, 32, 32, 3]
    assert got["splits"] == ["execution", "semantic", "train", "vision"]
    assert got["steps"] == 4 and got["report_step"] == 4
    assert all(0.0 <= v <= 1.0 for v in [*got["first"].values(), *got["last"].values()])
    # Four episodes of 32 px frames as rows, white 1 px gaps between them.
    assert got["strip"][0] == 4 * 32 + 3 and got["strip"][2] in (3, 4)


CHECKS = {
    "quickstart_control.ipynb": (
        '{"ppo_steps": ppo.final["step"], "sac_steps": sac.final["step"], "report_step": report["step"], '
        '"report_return": report["eval/return"], "actions": list(actions.shape), '
        '"sac_first": sac.metrics.column("env/return")[1][0], "sac_best": max(sac.metrics.column("eval/return")[1][-2:])}',
        _control,
    ),
    "placement.ipynb": (
        '{"runners": {m: p["runner"] for m, p in placements.items()}, '
        '"requested": {m: p["requested"] for m, p in placements.items()}, '
        '"disaggregated_devices": {n: c["devices"] for n, c in placements["disaggregated"]["components"].items()}, '
        '"worst": worst}',
        _placement,
    ),
    "reasoning_grpo.ipynb": (
        '{"steps": grpo.final["step"], "answers": len(answers_after), "warm_start": str(grpo.summary.warm_start), '
        '"pass1": report["pass@1"], "final_accuracy": grpo.final["eval/accuracy"], "accuracy": accuracy.tolist()}',
        _reasoning,
    ),
    "vla_tabletop.ipynb": (
        '{"scene": list(images.shape), "splits": splits, "steps": vla.final["step"], "report_step": report["step"], '
        '"first": {s: float(v) for s, v in first.items()}, "last": last, "strip": list(strip.shape)}',
        _vla,
    ),
    "own_model_and_data.ipynb": (
        '{"model_type": converted["model_type"], "params": converted["params"], "grpo_steps": grpo.final["step"], '
        '"sft_accuracy": sft_acc.tolist(), "answers": samples}',
        _own,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CHECKS))
def test_notebook_runs_in_a_kernel_and_shows_what_it_says(name, tmp_path):
    check, judge = CHECKS[name]
    nb, got = execute(name, tmp_path, check)
    judge(nb, got)

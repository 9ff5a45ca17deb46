"""The public API (`import rlinf_jax as rj`): what notebooks and scripts build on."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import rlinf_jax as rj
from rlinf_jax.errors import BadInput
from tests.conftest import TINY
from tests.test_sft import TINY_LM


def test_import_is_cheap_and_the_api_is_at_the_top():
    # `import rlinf_jax` loads no JAX (the CLIs answer --help before it); the API loads on use.
    code = ("import sys, rlinf_jax as rj; assert 'jax' not in sys.modules; "
            "assert callable(rj.train) and callable(rj.evaluate) and callable(rj.load_config); "
            "print(sorted(n for n in rj.__all__ if not n.startswith('_')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    for name in ("train", "evaluate", "restore", "read_metrics", "load_config", "Metrics", "BadInput"):
        assert name in out.stdout


def test_the_command_names_stay_the_api_functions():
    # `python -m rlinf_jax.train` runs the command; the package's `train` is still the function, and the
    # command modules refuse an import that would turn the package's attribute into a module.
    for name in ("train", "evaluate", "convert", "plan"):
        assert getattr(rj, name) is getattr(rj.api, name)
        with pytest.raises(ImportError, match=f"python -m rlinf_jax.{name}.*rlinf_jax.cli.{name}"):
            importlib.import_module(f"rlinf_jax.{name}")
        assert getattr(rj, name) is getattr(rj.api, name)
    proc = subprocess.run([sys.executable, "-m", "rlinf_jax.plan", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "python -m rlinf_jax.plan" in proc.stdout
    with pytest.raises(BadInput, match="overrides with a recipe name"):
        rj.train(rj.load_config("ppo_brax", TINY), ["runner.max_steps=1"])


def test_load_config_takes_a_dict_of_overrides_and_refuses_a_string():
    cfg = rj.load_config("ppo_brax", {"runner.max_steps": 7, "env.name": "inverted_pendulum",
                                      "actor.model.policy_hidden_sizes": [8, 8], "runner.tensorboard": False,
                                      "runner.experiment_name": "1e-3"})
    assert cfg.runner.max_steps == 7 and list(cfg.actor.model.policy_hidden_sizes) == [8, 8]
    assert cfg.runner.tensorboard is False and cfg.runner.experiment_name == "1e-3"
    with pytest.raises(BadInput, match="list of 'key=value' strings"):
        rj.load_config("ppo_brax", "runner.max_steps=3")
    with pytest.raises(BadInput):
        rj.load_config("no_such_recipe")
    assert "ppo_brax" in rj.list_recipes() and "inverted_pendulum" in rj.list_envs()["brax"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: rj.train(42), "cfg must be a Config \\(rj.load_config\\) or a recipe name, not int 42"),
        (lambda: rj.train(None), "cfg must be a Config .*, not None"),
        (lambda: rj.evaluate(None),
         "path must be a run folder, a checkpoint or a model directory \\(a str or path\\), not None"),
        (lambda: rj.evaluate(""), "path must be .*, not an empty string"),
        (lambda: rj.evaluate("runs/x", seed="1"), "seed must be an integer, not str '1'"),
        (lambda: rj.evaluate("runs/x", strip_episodes=2.5), "strip_episodes must be an integer, not float 2.5"),
        (lambda: rj.evaluate("runs/x", strip=3), "strip must be a new PNG file \\(a str or path\\), not int 3"),
        (lambda: rj.restore(3.5), "path must be a run folder, .*, not float 3.5"),
        (lambda: rj.load_config(7), "name must be a recipe name \\(a str; rj.list_recipes\\(\\) lists them\\), not int 7"),
        (lambda: rj.load_config("ppo_brax", 5), "overrides must be a list of 'key=value' strings or a dict, not int 5"),
        (lambda: rj.load_config("ppo_brax", ["runner.max_steps=3", 4]), "overrides\\[1\\] must be a 'key=value' string"),
        (lambda: rj.load_config("ppo_brax", {("runner", "seed"): 2}), "overrides' keys must be config keys"),
        (lambda: rj.load_config("ppo_brax", config_dir=3), "config_dir must be a folder of recipes"),
        (lambda: rj.read_metrics(None), "run must be a run folder or its metrics.jsonl \\(a str or path\\), not None"),
        (lambda: rj.convert(None, "out"), "src must be a Hugging Face model directory"),
        (lambda: rj.convert("src", 3), "out must be a new or empty directory"),
        (lambda: rj.convert("src", "out", dtype=None), "dtype must be a dtype name"),
        (lambda: rj.convert("src", "out", allow_nonfinite="yes"), "allow_nonfinite must be True or False, not str 'yes'"),
    ],
)
def test_arguments_of_the_wrong_type_are_bad_input_naming_the_argument(call, message):
    with pytest.raises(BadInput, match=message) as e:
        call()
    assert "\n" not in str(e.value)


def test_no_overrides_may_be_given_as_none():
    assert rj.load_config("ppo_brax", None).runner.max_steps == rj.load_config("ppo_brax").runner.max_steps


@pytest.mark.slow
def test_a_control_run_from_python(tmp_path):
    cfg = rj.load_config("ppo_brax", [*TINY, f"runner.output_dir={tmp_path}", "runner.experiment_name=api",
                                      "runner.max_steps=2", "runner.eval_interval=1", "runner.save_interval=2",
                                      "runner.tensorboard=false"])
    result = rj.train(cfg)
    assert result.run_dir == tmp_path / "api" and result.final["step"] == 2
    # The metrics by row and by column agree with the file, and the summary.
    m = rj.read_metrics(result.run_dir)
    assert m == result.metrics and "eval/return" in m.keys()
    steps, values = m.column("eval/return")
    assert steps.tolist() == [1, 2] and values[-1] == pytest.approx(result.summary.eval_return)
    assert m.last("eval/return") == result.final["eval/return"] == values[-1]
    with pytest.raises(KeyError, match="no metric 'eval/nothing'"):
        m.column("eval/nothing")
    # The plot draws what the column holds.
    import matplotlib

    matplotlib.use("Agg")
    ax = m.plot("eval/return", "env/return")
    assert [line.get_label() for line in ax.get_lines()] == ["eval/return", "env/return"]
    assert ax.get_lines()[0].get_ydata().tolist() == values.tolist()
    # Evaluating the saved run gives the run's last evaluation again: the same episodes.
    again = rj.evaluate(result.run_dir)
    assert again["step"] == 2 and again["eval/return"] == pytest.approx(values[-1], rel=1e-5)
    # The restored policy acts on the run's env: the mode is deterministic, samples vary.
    policy = result.restore()
    state = policy.env.reset(jax.random.PRNGKey(0))
    obs = state.obs
    a1, a2 = np.asarray(policy(obs)), np.asarray(policy(obs))
    assert a1.shape == (cfg.env.num_envs, policy.env.action_size) and np.array_equal(a1, a2)
    assert np.all(np.abs(a1) <= 1.0)
    keys = jax.random.split(jax.random.PRNGKey(1), cfg.env.num_envs)
    assert not np.array_equal(np.asarray(policy.sample(obs, keys)), a1)


@pytest.mark.parametrize("x", ["step", "env/steps"])
def test_a_saved_plot_keeps_its_axis_labels_inside_the_figure(tmp_path, x):
    import matplotlib

    matplotlib.use("Agg")
    m = rj.Metrics([{"step": s, "eval/return": 100.0 * s, "env/steps": 10240 * s} for s in range(0, 100, 10)])
    ax = m.plot("eval/return", x=x)
    fig = ax.figure
    fig.savefig(tmp_path / "curve.png", bbox_inches=None)  # the figure as it is, not cropped to fit
    renderer = fig.canvas.get_renderer()
    lo, hi = sorted(ax.get_xlim())
    shown_ticks = [t for t in ax.get_xticklabels() if lo <= t.get_position()[0] <= hi]  # the ones drawn
    for label in (ax.xaxis.label, *shown_ticks):
        box = label.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1, label
        assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, label
    assert ax.get_xlabel() == ("iteration" if x == "step" else x)


def test_a_language_model_run_from_python(tmp_path):
    result = rj.train("sft_math", [*TINY_LM, f"runner.output_dir={tmp_path}", "runner.experiment_name=lm",
                                   "runner.max_steps=2", "runner.eval_interval=2", "actor.global_batch_size=8",
                                   "actor.micro_batch_size=8", "data.eval_size=8"])
    assert result.final["step"] == 2 and "eval/accuracy" in result.final
    sampler = rj.restore(result.run_dir)
    answers = sampler(["What is 2 + 3?", "What is 7 * 6?"], max_new_tokens=6)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    assert sampler("What is 2 + 3?", max_new_tokens=6) == answers[:1]  # greedy: the same text again
    report = rj.evaluate(result.run_dir, progress=False, out=tmp_path / "eval.json")
    assert report["problems"] == 8 and report["pass@1"] == pytest.approx(result.final["eval/accuracy"])


def test_bad_paths_are_bad_input(tmp_path):
    with pytest.raises(BadInput, match="no such path"):
        rj.evaluate(tmp_path / "missing")
    with pytest.raises(BadInput, match="no such path"):
        rj.restore(tmp_path / "missing")
    with pytest.raises(BadInput):
        rj.read_metrics(tmp_path)


def test_the_readme_snippet_and_the_readme_command_write_different_run_folders():
    """The README's first command and its Python snippet, run one after the other in either
    order, must not write one run folder (the second would be refused)."""
    import ast
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    call = next(n for n in ast.walk(ast.parse(snippet)) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "train")
    recipe, overrides = (ast.literal_eval(a) for a in call.args)
    command = re.search(r"pip install -e \. && python -m rlinf_jax\.train(.*)\n", readme).group(1).split()
    assert command == [] and recipe == "ppo_brax"  # the command is the default recipe
    from_python, from_cli = rj.load_config(recipe, overrides).runner, rj.load_config().runner
    assert (from_python.output_dir, from_python.experiment_name) != (from_cli.output_dir, from_cli.experiment_name)

"""The public API (`import rlinf_jax as rj`): what notebooks and scripts build on."""

from __future__ import annotations

import subprocess
import sys

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


def test_train_is_the_api_function_even_after_the_command_module_is_imported(tmp_path):
    import rlinf_jax.train as command  # what `python -m rlinf_jax.train` and tests import

    assert rj.train is command and command.main is not None  # the package's attribute is the module ...
    with pytest.raises(BadInput, match="overrides with a recipe name"):
        rj.train(rj.load_config("ppo_brax", TINY), ["runner.max_steps=1"])  # ... and calling it is api.train


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
    # Evaluating the saved run gives the run's last evaluation again.
    again = rj.evaluate(result.run_dir)
    assert again["step"] == 2 and again["eval/return"] > 0
    # The restored policy acts on the run's env: the mode is deterministic, samples vary.
    policy = result.restore()
    state = policy.env.reset(jax.random.PRNGKey(0))
    obs = state.obs
    a1, a2 = np.asarray(policy(obs)), np.asarray(policy(obs))
    assert a1.shape == (cfg.env.num_envs, policy.env.action_size) and np.array_equal(a1, a2)
    assert np.all(np.abs(a1) <= 1.0)
    keys = jax.random.split(jax.random.PRNGKey(1), cfg.env.num_envs)
    assert not np.array_equal(np.asarray(policy.sample(obs, keys)), a1)


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

"""The memory check before a run's first step (`cluster.memory_check`): on a backend that
reports each device's memory, a run compiles its iteration's programs for its devices (its
task's planner: reasoning, sft, embodied PPO, off-policy) and refuses a layout that cannot
fit in one line, before anything is trained; a layout the planner does not know is skipped.

XLA's CPU backend reports no memory limit, so the limit is given here as a GPU or TPU
backend would report it (`device_memory_bytes`); the programs are the run's own, compiled
by the CPU compiler, and their memory is what that compiler reports."""

from __future__ import annotations

import pytest

import rlinf_jax.flow.plan as plan_lib
from rlinf_jax.runtime import list_steps
from rlinf_jax.cli.train import main
from tests.test_reasoning_flow import TINY

RUN = ["--config-name", "grpo_math", *TINY, "sft.warm_start_steps=0", "runner.max_steps=1", "runner.eval_interval=0",
       "runner.save_interval=1"]


def _device_memory(monkeypatch, limit):
    monkeypatch.setattr(plan_lib, "device_memory_bytes", lambda devices: limit)


def test_a_run_that_cannot_fit_its_devices_is_refused_before_its_first_step(tmp_path, monkeypatch, capsys):
    _device_memory(monkeypatch, 256 * 1024.0)  # 256 KiB a device: the tiny model's update alone needs more
    rc = main([*RUN, f"runner.output_dir={tmp_path}", "runner.experiment_name=small"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("error: does not fit: "), err
    assert "GiB per chip" in err[0] and "python -m rlinf_jax.plan --remedies" in err[0]
    assert list_steps(tmp_path / "small" / "checkpoints") == []  # nothing trained, nothing saved


def test_a_run_that_fits_says_so_and_trains(tmp_path, monkeypatch, capsys):
    _device_memory(monkeypatch, 64 * 1024.0**3)
    assert main([*RUN, f"runner.output_dir={tmp_path}", "runner.experiment_name=big"]) == 0
    out = capsys.readouterr().out
    assert "memory check: fits: the largest program" in out, out[-2000:]
    assert list_steps(tmp_path / "big" / "checkpoints") == [1]


def test_the_check_can_be_turned_off(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the memory check ran although cluster.memory_check=false")

    monkeypatch.setattr(plan_lib, "refuse_unless_fits", never)
    _device_memory(monkeypatch, 256 * 1024.0)
    assert main([*RUN, f"runner.output_dir={tmp_path}", "runner.experiment_name=off",
                 "cluster.memory_check=false"]) == 0


def test_the_cpu_backend_reports_no_limit_and_nothing_is_compiled():
    import jax

    assert plan_lib.device_memory_bytes(jax.devices()) is None
    assert plan_lib.refuse_unless_fits(lambda d: pytest.fail("compiled on the CPU"), jax.devices()) is None


@pytest.mark.slow
@pytest.mark.parametrize("recipe, extra", [
    ("ppo_brax", ["runner.max_steps=1", "env.num_envs=64", "algorithm.rollout_length=4"]),
    ("sac_brax", ["runner.max_steps=1", "algorithm.offpolicy.learning_starts=0"]),
])
def test_control_runs_are_checked_too(tmp_path, monkeypatch, capsys, recipe, extra):
    run = ["--config-name", recipe, *extra, "runner.eval_interval=0", f"runner.output_dir={tmp_path}"]
    _device_memory(monkeypatch, 1024.0)  # 1 KiB a device: nothing fits
    assert main([*run, "runner.experiment_name=small"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: does not fit: collocated/"), err
    assert list_steps(tmp_path / "small" / "checkpoints") == []
    if recipe == "ppo_brax":
        # A layout the planner does not know (stages) is not checked, says so, and trains.
        assert main([*run, "runner.experiment_name=staged", "flow.max_staleness=1"]) == 0
        assert "memory check: skipped: " in capsys.readouterr().out
        assert list_steps(tmp_path / "staged" / "checkpoints") == [1]

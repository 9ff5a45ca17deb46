"""Embodied PPO on a host simulator (env.suite=gym): micro-batches and workers change no
number, checkpoints carry the episode counters, bad env ids are one error line, and every
worker process is gone after a run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest

from rlinf_jax.config import load_config
from rlinf_jax.tasks.embodied.build import build_trainer
from rlinf_jax.flow.host import Host
from rlinf_jax.cli.evaluate import main as evaluate_main
from rlinf_jax.runtime import read_metrics
from rlinf_jax.cli.train import main as train_main
from rlinf_jax.flow.seeds import runner_info

pytest.importorskip("gymnasium")

TINY = [
    "env.num_envs=8", "env.num_eval_envs=4", "env.episode_length=20", "algorithm.rollout_length=8",
    "algorithm.num_minibatches=2", "algorithm.update_epochs=1", "actor.model.policy_hidden_sizes=[16,16]",
    "actor.model.value_hidden_sizes=[16,16]", "runner.progress_bar=false", "runner.tensorboard=false",
]


def _params_after(overrides, iterations=2):
    trainer = build_trainer(load_config("ppo_gym_mujoco", [*TINY, *overrides]))
    assert isinstance(trainer, Host)
    # The host runner runs the fused runner's algorithm, and placement.json says so.
    assert runner_info(trainer) == {"runner": "Host", "algorithm": "PPO"}
    try:
        state = trainer.init()
        state, sums = trainer.run_iterations(state, iterations)
        metrics = trainer.summarize(sums, iterations)
        ev = trainer.run_eval(state, jax.random.PRNGKey(3))
        leaves = [np.asarray(x) for x in jax.tree.leaves(state.learner.params)]
        pids = [w.proc.pid for w in trainer.pool.workers]
        return leaves, metrics, ev, trainer.snapshot(state), pids
    finally:
        trainer.close()


@pytest.mark.slow
def test_micro_batches_and_workers_change_no_number():
    """Sequential (1 micro-batch, 1 worker) and pipelined (2 micro-batches, 2 or 4 workers)
    runs: the same parameters, metrics and evaluation."""
    ref, m_ref, ev_ref, snap, pids = _params_after(["flow.num_micro_batches=1", "env.num_workers=1"])
    assert m_ref["env/episodes"] > 0  # 16 steps of an episode of 20 base steps: some fell
    for workers in (2, 4):
        got, m, ev, _, _ = _params_after(["flow.num_micro_batches=2", f"env.num_workers={workers}"])
        for a, b in zip(ref, got):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        assert m["env/return"] == pytest.approx(m_ref["env/return"], rel=1e-6)
        assert ev == pytest.approx(ev_ref, rel=1e-6)
    # What a checkpoint holds to resume: each env's episode counter.
    counters = np.asarray(snap.env_state["episode_index"])
    assert counters.shape == (8,) and counters.sum() == m_ref["env/episodes"]  # summed over the iterations
    # close() stopped every worker.
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_resumed_pool_starts_at_the_checkpointed_episodes():
    trainer = build_trainer(load_config("ppo_gym_mujoco", TINY))
    try:
        state = trainer.init()
        state, _ = trainer.run_iterations(state, 1)
        snap = trainer.snapshot(state)
        resumed = trainer.start(jax.device_get(snap))
        np.testing.assert_array_equal(trainer.pool.arrays["episode_index"], snap.env_state["episode_index"])
        resumed, _ = trainer.run_iterations(resumed, 1)
    finally:
        trainer.close()


def test_a_training_run_end_to_end_and_bad_env_ids(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = ["--config-name", "ppo_gym_mujoco", *TINY, f"runner.output_dir={out}", "runner.max_steps=2",
            "runner.eval_interval=2", "runner.save_interval=2"]
    # As users run it: TensorBoard on, so the evaluation's media step runs too.
    assert train_main([*argv, "runner.tensorboard=true"]) == 0
    capsys.readouterr()
    # The saved policy evaluates in a pool of its own, closed afterwards.
    assert evaluate_main([str(out / "ppo_gym_InvertedPendulum-v5")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 2 and result["env"] == "gym/InvertedPendulum-v5" and result["eval/return"] > 0
    assert train_main([*argv, "env.name=InvertedPendulumm-v5", "runner.experiment_name=bad"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "InvertedPendulumm-v5" in err


def test_a_crash_loop_stops_the_run_in_one_line_and_a_rare_crash_does_not(tmp_path, monkeypatch, capsys):
    """The toy simulator (tests/hostsim_toy.py) crashing every 3rd step stops the run with
    one error line (exit 2) naming the env, the exit code and the worker's last output;
    one crash in a run is replaced and the run finishes."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parent))  # the workers import the toy by name
    argv = ["--config-name", "ppo_gym_mujoco", *TINY, "env.name=hostsim_toy:HostsimToy-v0", "env.num_workers=1",
            "runner.max_steps=2", "runner.eval_interval=2", f"runner.output_dir={tmp_path}"]
    assert train_main([*argv, "env.gym_kwargs={crash_every: 3}", "env.max_worker_restarts=3",
                       "runner.experiment_name=crash_loop"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(
        "error: env.name='hostsim_toy:HostsimToy-v0' keeps failing: 4 env worker replacements within 100 steps, "
        "more than env.max_worker_restarts=3; the last, worker 0 (envs 0-3, 4-7): exited with code 3; its last output: "
        "toy simulator: giving up at step 3"
    ), errors[0]
    assert err.count("warning: env worker 0 (envs 0-3, 4-7) replaced: exited with code 3") == 3
    # 16 steps of each training env: one crash at the 12th, none in the evaluation's
    # episodes of at most 10 steps.
    assert train_main([*argv, "env.gym_kwargs={crash_every: 12}", "env.episode_length=10",
                       "runner.experiment_name=one_crash"]) == 0
    last = read_metrics(tmp_path / "one_crash")[-1]
    assert last["step"] == 2 and last["env/worker_restarts"] == 1 and "eval/return" in last


@pytest.mark.slow
@pytest.mark.devices(2)
def test_every_layout_on_two_devices_gives_one_devices_numbers():
    """Data-parallel over two devices, disaggregated (envs and rollout on one device, the
    update on the other) and the mirror mapping: the same parameters, metrics and evaluation."""
    ref, m_ref, ev_ref, _, _ = _params_after(["cluster.num_devices=1", "env.num_workers=1"])
    for layout in ("collocated", "disaggregated", "{env: 1, rollout: 1, actor: 0}"):
        got, m, ev, _, _ = _params_after(["cluster.num_devices=2", "env.num_workers=1",
                                          f"cluster.component_placement={layout}"])
        for a, b in zip(ref, got):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=layout)
        assert m == pytest.approx(m_ref, rel=1e-5, abs=1e-6), layout
        assert ev == pytest.approx(ev_ref, rel=1e-6), layout


@pytest.mark.slow
@pytest.mark.devices(2)
def test_the_rollout_infers_on_its_own_device():
    trainer = build_trainer(load_config("ppo_gym_mujoco", [*TINY, "cluster.num_devices=2",
                                                           "cluster.component_placement={env: 1, rollout: 1, actor: 0}"]))
    try:
        state = trainer.init()
        local = trainer._for_rollout((state.learner.params, state.learner.obs_stats))
        assert {d.id for leaf in jax.tree.leaves(local) for d in leaf.devices()} == {1}
        assert {d.id for leaf in jax.tree.leaves(state.learner.params) for d in leaf.devices()} == {0}
    finally:
        trainer.close()

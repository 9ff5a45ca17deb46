"""The off-policy family on a host simulator (env.suite=gym): the number of workers changes
no number and micro-batches none beyond float32 rounding, checkpoints carry the buffer and
the episode counters, the saved actor evaluates, and the settings a host loop cannot honour
are one error line."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from rlinf_jax.config import load_config
from rlinf_jax.cli.evaluate import main as evaluate_main
from rlinf_jax.runtime import read_metrics
from rlinf_jax.flow.host import Host
from rlinf_jax.tasks.offpolicy.run import build_trainer
from rlinf_jax.cli.train import main as train_main
from rlinf_jax.flow.seeds import runner_info

pytest.importorskip("gymnasium")

TINY = [
    "env.num_envs=8", "env.num_eval_envs=2", "env.episode_length=20", "algorithm.rollout_length=4",
    "algorithm.offpolicy.utd_ratio=2", "algorithm.offpolicy.batch_size=16", "algorithm.offpolicy.learning_starts=32", "algorithm.offpolicy.replay_size=512",
    "actor.model.policy_hidden_sizes=[16,16]", "actor.model.value_hidden_sizes=[16,16]",
    "runner.progress_bar=false", "runner.tensorboard=false",
]


def _after(overrides, iterations=3):
    trainer = build_trainer(load_config("sac_gym_mujoco", [*TINY, *overrides]))
    assert isinstance(trainer, Host)
    assert runner_info(trainer) == {"runner": "Host", "algorithm": "OffPolicy"}
    try:
        state = trainer.init()
        trainer.compile(state, jax.random.PRNGKey(0))
        state, sums = trainer.run_iterations(state, iterations)
        metrics = trainer.summarize(sums, iterations)
        leaves = [np.asarray(x) for x in jax.tree.leaves((state.learner.actor, state.learner.critic))]
        return leaves, metrics, trainer.run_eval(state, jax.random.PRNGKey(1))
    finally:
        trainer.close()


def test_workers_and_micro_batches_change_no_number():
    one, m1, e1 = _after(["env.num_workers=1"])
    two, m2, e2 = _after(["env.num_workers=2"])
    # Two micro-batches of 4 envs, a worker each: the keys belong to envs, not to parts.
    halves, m3, e3 = _after(["env.num_workers=2", "flow.num_micro_batches=2"])
    # Four random batched steps fill the 32 transitions learning waits for; the fourth's
    # learner step is the first to learn: 1 + 8 steps of 2 gradient steps.
    assert m1["rollout/random_actions"] == 4 and m1["train/gradient_steps"] == 2 + 2 * 4 * 2
    assert m1["rollout/replay_size"] == 3 * 4 * 8
    for a, b, c in zip(one, two, halves):
        np.testing.assert_array_equal(a, b)
        # A policy product over 4 rows may round differently from the same rows among 8:
        # XLA:CPU picks its matmul kernels by shape, and on some CPUs (the AMD EPYC with
        # AVX2) the two differ in the last bit (11 of 16 elements of a layer by one ulp
        # after 3 iterations). Within float32 rounding, not bit for bit.
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-8)
    assert m1 == m2 and e1 == e2
    assert m3 == pytest.approx(m1, rel=1e-5) and e3 == pytest.approx(e1, rel=1e-5)


@pytest.mark.slow
def test_a_run_saves_resumes_and_evaluates(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = ["--config-name", "sac_gym_mujoco", *TINY, f"runner.output_dir={out}", "runner.eval_interval=2",
            "runner.save_interval=2", "runner.experiment_name=run"]
    assert train_main([*argv, "runner.max_steps=2"]) == 0
    assert train_main([*argv, "runner.max_steps=4", "runner.resume=auto"]) == 0
    records = read_metrics(out / "run")
    assert [r["step"] for r in records if "eval/return" in r] == [2, 4]
    # The buffer came back with the checkpoint: it holds all four iterations' transitions.
    assert records[-1]["rollout/replay_size"] == 4 * 4 * 8
    capsys.readouterr()
    assert evaluate_main([str(out / "run")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 4 and result["env"] == "gym/InvertedPendulum-v5" and result["eval/return"] > 0


def test_what_a_host_loop_cannot_do_is_one_error_line(capsys):
    base = ["--config-name", "sac_gym_mujoco", *TINY]
    for override, words in ((["flow.max_staleness=1"], "flow.max_staleness=0"),
                            (["env.camera=agentview"], "env.camera")):
        assert train_main([*base, *override]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and words in err, err


def test_the_host_loop_computes_what_the_fused_program_computes(monkeypatch):
    """The same SAC on tests/hostsim_toy.py's env stepped by a worker and on its JAX twin
    (tests/test_hostsim.py's) inside the fused program: the host loop's order of acting,
    stepping, inserting and learning is the fused program's, so the numbers agree."""
    import dataclasses
    import pathlib

    from test_hostsim import _jax_stack

    from rlinf_jax.tasks.offpolicy.setup import make_setup
    from rlinf_jax.flow.fused import Fused
    from rlinf_jax.tasks.offpolicy.algorithm import OffPolicy

    monkeypatch.setenv("PYTHONPATH", str(pathlib.Path(__file__).parent))  # workers import the toy's module
    cfg = load_config("sac_gym_mujoco", [*TINY, "env.name=hostsim_toy:HostsimToy-v0", "env.reset_mode=cached",
                                         "algorithm.normalize_observations=false"])
    host_setup = make_setup(cfg)
    jax_setup = dataclasses.replace(host_setup, env=_jax_stack(8, 20, 1), eval_env=_jax_stack(2, 20, 1))
    fused = Fused(OffPolicy(cfg, jax_setup, jax.sharding.Mesh(jax.devices()[:1], ("data",))))
    ts = fused.init()
    fused.compile(ts, jax.random.PRNGKey(0))
    ts, sums = fused.run_iterations(ts, 3)
    host = build_trainer(cfg, host_setup)
    try:
        state, host_sums = host.run_iterations(host.init(), 3)
        for a, b in zip(jax.tree.leaves((ts.actor, ts.critic)), jax.tree.leaves((state.learner.actor,
                                                                                 state.learner.critic))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
        ours, theirs = fused.summarize(sums, 3), host.summarize(host_sums, 3)
        assert ours.keys() == theirs.keys() and ours["train/gradient_steps"] == 18 and ours["env/episodes"] > 0
        for k in ours:
            np.testing.assert_allclose(theirs[k], ours[k], rtol=1e-4, atol=1e-6, err_msg=k)
    finally:
        host.close()


@pytest.mark.slow
@pytest.mark.devices(2)
def test_two_devices_give_one_devices_numbers():
    """The learner replicated on two devices, each segment's rows split over them (the host
    runner's layout for any algorithm): the numbers of one device."""
    one, m1, e1 = _after(["cluster.num_devices=1"])
    two, m2, e2 = _after(["cluster.num_devices=2"])
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert m1.keys() == m2.keys()
    for k in m1:
        np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert e1 == pytest.approx(e2, rel=1e-5)

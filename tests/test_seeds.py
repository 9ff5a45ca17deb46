"""Seeds side by side (`rlinf_jax.flow.seeds`): several runs of one recipe in one program,
each equal to the same seed trained alone, logged per seed and as a mean with its 95%
interval, checkpointed together and evaluated by the run's own protocol."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rlinf_jax as rj
from rlinf_jax import array_types
from rlinf_jax.config import load_config
from rlinf_jax.errors import BadInput
from rlinf_jax.replay import TransitionBatch, write_transitions
from rlinf_jax.runtime import Checkpointer
from rlinf_jax.flow import seeds
from rlinf_jax.flow.seeds import SeedBatch, interval, resolve_seeds
from rlinf_jax.tasks.embodied.build import build_trainer as build_ppo
from rlinf_jax.tasks.offpolicy.run import build_trainer as build_offpolicy
from rlinf_jax.tasks.registry import load_run_config
from tests.conftest import TINY
from tests.test_offpolicy import TINY_SAC
from tests.test_vla_flow import TINY_VLA

# ------------------------------------------------------------------ the statistics


def test_interval_is_students_t_on_a_hand_example():
    # Four values: mean 3, sample std sqrt(10/3); t(0.975, 3) = 3.182446305 (tables).
    mean, half = interval([1.0, 2.0, 4.0, 5.0])
    assert mean == 3.0
    assert half == pytest.approx(3.182446305 * np.sqrt(10 / 3) / 2, rel=1e-8)
    assert interval([7.0]) == (7.0, 0.0)


def test_combine_names_the_mean_its_interval_and_each_seed():
    out = seeds.combine([{"eval/return": 10.0, "env/return": 1.0}, {"eval/return": 14.0}], (3, 8))
    assert out["eval/return"] == 12.0 and out["eval/return@seed3"] == 10.0 and out["eval/return@seed8"] == 14.0
    assert out["eval/return@ci95"] == pytest.approx(interval([10.0, 14.0])[1])
    # A metric only one run has (no episode ended in the other) is that run's alone.
    assert out["env/return"] == 1.0 and "env/return@seed8" not in out
    assert seeds.described(out, "eval/return", ".1f") == f"12.0 ± {out['eval/return@ci95']:.1f} (2 seeds)"


class _Runner:
    def __init__(self, seed=0, num_seeds=1, seeds=()):
        self.seed, self.num_seeds, self.seeds = seed, num_seeds, list(seeds)


def test_seeds_resolve_from_a_count_or_a_list_and_bad_ones_are_refused():
    assert resolve_seeds(_Runner(seed=5)) == (5,)
    assert resolve_seeds(_Runner(seed=5, num_seeds=3)) == (5, 6, 7)
    assert resolve_seeds(_Runner(seeds=[9, 2])) == (9, 2)
    for bad, words in [
        (_Runner(num_seeds=0), "at least 1"),
        (_Runner(seeds=[1, 1]), "repeats"),
        (_Runner(seeds=[1, 2], num_seeds=3), "one of the two"),
        (_Runner(seeds=[4]), "runner.seed=4"),
        (_Runner(seeds=[-1, 2]), "seeds must be"),
    ]:
        with pytest.raises(BadInput, match=words):
            resolve_seeds(bad)


def test_tasks_without_seed_batches_refuse_them():
    with pytest.raises(BadInput, match="a sft run trains one"):
        load_run_config("sft_math", ["runner.num_seeds=2"])


def test_layouts_that_cannot_batch_seeds_say_why():
    cfg = load_config("ppo_brax", [*TINY, "runner.seeds=[0,1]", "cluster.component_placement=collocated",
                                   "flow.max_staleness=1"])
    with pytest.raises(BadInput, match="runner.seeds trains 2 runs side by side.*flow.max_staleness=0"):
        build_ppo(cfg)


# ------------------------------------------------------------------ equal to alone


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _chunk(trainer, iterations: int):
    state = trainer.init()
    trainer.compile(state, seeds.eval_key(0, 0))
    state, sums = trainer.run_iterations(state, iterations)
    # A run alone evaluates with its seed's key at the step; a batch derives each run's key itself.
    evaluation = trainer.run_eval(state, seeds.eval_key(trainer.cfg.runner.seed, iterations))
    return state, trainer.summarize(sums, iterations), {k: float(v) for k, v in evaluation.items()}


@pytest.mark.slow
@pytest.mark.parametrize("recipe, build, overrides, rtol", [
    # PPO's products batch to the same sums here; SAC's 128-row critic products are
    # reassociated by the batched matmul, and 96 gradient steps carry it a little further.
    ("ppo_brax", build_ppo, [*TINY, "cluster.component_placement=collocated"], 1e-5),
    ("sac_brax", build_offpolicy, [*TINY_SAC, "algorithm.offpolicy.learning_starts=64", "algorithm.rollout_length=8",
                                   "algorithm.offpolicy.utd_ratio=4"], 2e-3),
    # Batch renormalisation's running statistics and the policy delay, per run.
    ("crossq_brax", build_offpolicy, [*TINY_SAC, "algorithm.offpolicy.learning_starts=64", "algorithm.rollout_length=8",
                                      "algorithm.offpolicy.utd_ratio=4", "algorithm.offpolicy.batch_size=64"], 2e-3),
    # MJX's physics under the seed axis. The state holds to 1e-5; the logged pre-clip gradient
    # norm (about 330, clipped to 1) sums reassociated squares and lands 6e-4 apart on some
    # CPUs (seen on an Intel Xeon with AVX-512 and AMX), so the metrics are compared at 1e-3.
    ("ppo_brax", build_ppo, [*TINY, "cluster.component_placement=collocated", "env.suite=playground",
                             "env.name=CartpoleBalance", "env.backend=jax", "env.episode_length=50"], (1e-5, 1e-3)),
], ids=["ppo", "sac", "crossq", "ppo-playground"])
def test_each_seed_equals_the_same_seed_trained_alone(recipe, build, overrides, rtol):
    _each_seed_equals_alone(recipe, build, overrides, rtol)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["rlpd_brax", "iql_brax"])
def test_each_seed_equals_alone_when_learning_from_a_dataset(recipe, tmp_path):
    """RLPD (demonstrations in every batch, a fixed argument of the vmapped chunk) and IQL
    (the dataset preloaded into each run's buffer, offline iterations first)."""
    n, rng = 512, np.random.default_rng(0)
    demos = TransitionBatch(
        obs=rng.normal(size=(n, 4)).astype(np.float32), action=rng.uniform(-1, 1, (n, 1)).astype(np.float32),
        reward=rng.normal(size=n).astype(np.float32), next_obs=rng.normal(size=(n, 4)).astype(np.float32),
        terminated=(rng.uniform(size=n) < 0.05).astype(np.float32),
    )
    path = write_transitions(tmp_path / "demos.parquet", demos, np.zeros(n), np.zeros(n))
    overrides = [*TINY_SAC, f"algorithm.offpolicy.demo_path={path}", "algorithm.offpolicy.learning_starts=64", "algorithm.rollout_length=8",
                 "algorithm.offpolicy.utd_ratio=4"]
    if recipe == "iql_brax":  # two offline iterations, then one online
        overrides.append("algorithm.offpolicy.offline_iterations=2")
    _each_seed_equals_alone(recipe, build_offpolicy, overrides, 2e-3)


@pytest.mark.slow
def test_fixed_evaluation_episodes_are_each_seeds_own_at_every_step(tmp_path):
    # runner.eval_episodes=fixed with seeds side by side: each seed plays its own step-0
    # episodes at every evaluation, so a policy that does not change (lr 1e-12, no
    # observation statistics) scores the same at every step, and each seed as it does alone.
    frozen = [*TINY, f"runner.output_dir={tmp_path}", "runner.max_steps=2", "runner.eval_interval=1",
              "runner.tensorboard=false", "runner.eval_episodes=fixed", "actor.optim.lr=1e-12",
              "algorithm.normalize_observations=false"]
    batch = rj.train("ppo_brax", [*frozen, "runner.seeds=[0,1]", "runner.experiment_name=both"]).metrics
    alone = rj.train("ppo_brax", [*frozen, "runner.seed=1", "runner.experiment_name=alone"]).metrics
    returns = [r for r in batch if "eval/return@seed0" in r]
    assert [r["step"] for r in returns] == [1, 2]
    for seed in (0, 1):
        assert returns[0][f"eval/return@seed{seed}"] == pytest.approx(returns[1][f"eval/return@seed{seed}"], rel=1e-6)
    assert returns[0]["eval/return@seed0"] != pytest.approx(returns[0]["eval/return@seed1"], rel=1e-3)
    assert alone.last("eval/return") == pytest.approx(returns[1]["eval/return@seed1"], rel=1e-4)


@pytest.mark.slow
def test_warm_started_seeds_each_start_from_their_own_warm_start_as_alone():
    # The tabletop VLA, cloned from the expert and its critic warmed up before PPO: each
    # run of the batch is cloned with its own seed (fresh model, demonstrations, keys), as
    # that seed's run alone is, and logs that warm start's metrics at step 0. From its
    # first state on the batch is the vmapped chunk the tests above compare with the seed
    # alone. (Episodes long enough for the scripted expert to finish its demonstrations.)
    overrides = [*TINY_VLA, "env.episode_length=32", "sft.warm_start_steps=3", "sft.num_demos=4", "sft.batch_size=8",
                 "sft.critic_warmup_steps=2", "sft.critic_warmup_episodes=4"]
    batch = build_ppo(load_run_config("ppo_vla_tabletop", [*overrides, "runner.seeds=[0,3]"]))
    alone = build_ppo(load_run_config("ppo_vla_tabletop", [*overrides, "runner.seed=3"]))
    assert isinstance(batch, SeedBatch)
    state, state3 = batch.init(), alone.init()
    array_types.check(state)
    for a, b in zip(_leaves(jax.tree.map(lambda x: x[1], state)), _leaves(state3)):
        np.testing.assert_array_equal(a, b)
    params = jax.tree.leaves(state.params)
    assert not all(np.array_equal(p[0], p[1]) for p in params)  # seed 0's own warm start
    warm, warm3 = batch.warm_start_metrics, alone.warm_start_metrics
    assert set(warm3) == {"warm_start/loss", "warm_start/bin_accuracy", "warm_start/value_mse"}
    for key, value in warm3.items():
        assert warm[key + "@seed3"] == value, key
    assert warm["warm_start/loss"] == pytest.approx((warm["warm_start/loss@seed0"] + warm3["warm_start/loss"]) / 2)


def _each_seed_equals_alone(recipe, build, overrides, rtol):
    rtol, metric_rtol = rtol if isinstance(rtol, tuple) else (rtol, rtol)  # the state's, the metrics' (one or two)
    batch = build(load_run_config(recipe, [*overrides, "runner.seeds=[0,3]"]))
    assert isinstance(batch, SeedBatch) and batch.num_runs == 2
    state, metrics, evaluation = _chunk(batch, 3)
    alone = build(load_run_config(recipe, [*overrides, "runner.seed=3"]))
    state3, metrics3, evaluation3 = _chunk(alone, 3)
    assert int(state.step[1]) == int(state3.step) == 3
    array_types.check(state)  # the annotated axes, with the seed axis in front
    array_types.check(state3)
    for a, b in zip(_leaves(jax.tree.map(lambda x: x[1], state)), _leaves(state3)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
    for key, value in {**metrics3, **evaluation3}.items():
        np.testing.assert_allclose(({**metrics, **evaluation})[key + "@seed3"], value, rtol=metric_rtol,
                                   atol=metric_rtol, err_msg=key)
    # The two runs differ (their own initial parameters, resets and keys), and the mean is theirs.
    assert not np.allclose(np.asarray(jax.tree.leaves(state)[0][0]), np.asarray(jax.tree.leaves(state)[0][1]))
    assert evaluation["eval/return"] == pytest.approx(
        (evaluation["eval/return@seed0"] + evaluation["eval/return@seed3"]) / 2)


# ------------------------------------------------------------------ a run: logs, resume, evaluate


@pytest.mark.slow
def test_a_run_of_seeds_logs_the_interval_resumes_exactly_and_evaluates_as_it_ran(tmp_path):
    run = [*TINY, f"runner.output_dir={tmp_path}", "runner.tensorboard=false", "runner.num_seeds=3",
           "runner.eval_interval=2", "runner.save_interval=2", "runner.log_interval=2"]
    whole = rj.train("ppo_brax", [*run, "runner.experiment_name=whole", "runner.max_steps=4"])
    text = whole.summary.text()
    assert "env steps per seed (3 seeds)" in text and "(all seeds)" in text
    final = whole.summary.last_eval
    assert f"final eval return  {final['eval/return']:.1f} ± {final['eval/return@ci95']:.1f} (3 seeds)" in text
    record = whole.metrics[-1]
    assert {"eval/return@seed0", "eval/return@seed1", "eval/return@seed2", "eval/return@ci95"} <= set(record)
    mean, half = interval([record[f"eval/return@seed{s}"] for s in range(3)])
    assert record["eval/return"] == pytest.approx(mean) and record["eval/return@ci95"] == pytest.approx(half)
    placement = json.loads((tmp_path / "whole" / "placement.json").read_text())
    assert (placement["runner"], placement["algorithm"], placement["seeds"]) == ("SeedBatch", "PPO", [0, 1, 2])
    with Checkpointer(tmp_path / "whole" / "checkpoints") as ckpt:
        assert ckpt.read_meta(4)["seeds"] == [0, 1, 2]

    # Killed after step 2, resumed: the same numbers as the run that went straight through.
    rj.train("ppo_brax", [*run, "runner.experiment_name=cut", "runner.max_steps=2"])
    resumed = rj.train("ppo_brax", [*run, "runner.experiment_name=cut", "runner.max_steps=4", "runner.resume=auto"])
    for key, value in record.items():
        if not key.startswith("time/"):
            assert resumed.metrics[-1][key] == pytest.approx(value, rel=1e-6, abs=1e-6), key

    # The evaluation of the checkpoint is the run's own at that step, twice over.
    first = rj.evaluate(tmp_path / "whole")
    assert first["step"] == 4
    for key in ("eval/return", "eval/return@ci95", "eval/return@seed2"):
        assert first[key] == pytest.approx(record[key], rel=1e-6), key
    assert rj.evaluate(tmp_path / "whole") == first
    other = rj.evaluate(tmp_path / "whole", seed=11)  # the same new episodes for every seed
    assert other["eval/return@seed0"] != record["eval/return@seed0"]

    # A resume that asks for other seeds than the checkpoint holds is refused.
    with pytest.raises(BadInput, match="seeds"):
        rj.train("ppo_brax", [*run, "runner.experiment_name=whole", "runner.max_steps=6", "runner.resume=auto",
                              "runner.num_seeds=2"])


def test_the_plot_draws_the_band_of_a_seed_batch():
    import matplotlib

    matplotlib.use("Agg")
    records = rj.api.Metrics([
        {"step": s, "eval/return": float(s), "eval/return@ci95": 1.0, "eval/return@seed0": s - 1.0,
         "eval/return@seed1": s + 1.0} for s in (1, 2, 3)
    ])
    ax = records.plot("eval/return")
    assert len(ax.collections) == 1  # the band
    assert ax.get_legend().get_texts()[1].get_text() == "95% interval (2 seeds)"
    np.testing.assert_allclose(jnp.asarray(ax.lines[0].get_ydata()), [1.0, 2.0, 3.0])


@pytest.mark.slow
@pytest.mark.devices(4)
def test_seeds_on_four_devices_split_each_runs_envs_and_equal_the_seed_alone():
    overrides = [*TINY, "cluster.component_placement=collocated", "cluster.num_devices=4"]
    batch = build_ppo(load_run_config("ppo_brax", [*overrides, "runner.seeds=[0,3]"]))
    state, metrics, _ = _chunk(batch, 2)
    obs = state.env_state.obs
    assert obs.shape[0] == 2 and len(obs.sharding.device_set) == 4
    assert obs.sharding.spec[0] is None  # the seed axis whole, each run's env batch split
    alone = build_ppo(load_run_config("ppo_brax", [*overrides, "runner.seed=3"]))
    _, metrics3, _ = _chunk(alone, 2)
    for key, value in metrics3.items():
        np.testing.assert_allclose(metrics[key + "@seed3"], value, rtol=1e-4, atol=1e-4, err_msg=key)

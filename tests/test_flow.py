"""The runners over algorithms: the contract, placement equality, staleness, resume, placement.json."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlinf_jax.config import load_config
from rlinf_jax.flow.algorithm import Algorithm
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.host import Host
from rlinf_jax.flow.seeds import SeedBatch
from rlinf_jax.flow.staged import Staged
from rlinf_jax.flow.trainer import EnvTrainer
from rlinf_jax.tasks.embodied import ppo
from rlinf_jax.tasks.embodied.auto_placement import Candidate, auto_placement, candidates, profile
from rlinf_jax.tasks.embodied.build import build_trainer
from rlinf_jax.tasks.embodied.run import run
from rlinf_jax.tasks.embodied.setup import make_setup
from rlinf_jax.tasks.embodied.algorithm import PPO
from rlinf_jax.tasks.offpolicy.algorithm import OffPolicy
from rlinf_jax.runtime import read_metrics
from tests.conftest import TINY


# ------------------------------------------------------------------ the trainer contract
def test_a_trainer_lacking_a_required_part_says_which_instead_of_returning_none():
    class Half(EnvTrainer):
        env_steps_per_iteration = 8

    class HalfAlgorithm(Algorithm):
        env_steps_per_iteration = 8

        def __init__(self):
            self.mesh = None
            self.freeze()

    half, fused = Half(), Fused(HalfAlgorithm())
    for call, what in ((half.init, "Half does not define init"),
                       (lambda: half.run_eval(None, None), "Half does not define run_eval"),
                       (lambda: half.summarize({}, 1), "Half does not define summarize"),
                       (lambda: half.strip(None, None, 1), "Half does not define strip"),
                       # The fused runner names the algorithm's part it lacks.
                       (fused.init, "HalfAlgorithm does not define fresh_state"),
                       (lambda: fused.start(None), "HalfAlgorithm does not define complete"),
                       (lambda: fused.compile_eval(None, None), "HalfAlgorithm does not define eval_args"),
                       (lambda: fused.summarize({}, 1), "HalfAlgorithm does not define summarize"),
                       # The steps the staged runner calls, likewise.
                       (lambda: fused.algorithm.iteration_keys(None), "HalfAlgorithm does not define iteration_keys"),
                       (lambda: fused.algorithm.act(None, None, None, 0, 0, 0), "HalfAlgorithm does not define act"),
                       (lambda: fused.algorithm.learn(None, None, None, 0), "HalfAlgorithm does not define learn"),
                       (lambda: fused.algorithm.relaid(None), "HalfAlgorithm does not define relaid")):
        with pytest.raises(NotImplementedError, match=what):
            call()
    # The optional parts have their defaults: a cold start, no camera, nothing measured by the layout.
    assert (half.warm_start_metrics, half.image_observations, half.flow_stats(), half.placement) == (None, False, {}, None)
    assert (fused.warm_start_metrics, fused.image_observations, fused.env_steps_per_iteration) == (None, False, 8)
    # An algorithm is frozen once built: nothing patches it after a runner traced its functions.
    with pytest.raises(AttributeError, match="HalfAlgorithm is frozen once built; cannot set mesh"):
        fused.algorithm.mesh = "elsewhere"
    # Every env-stepping runner is written against the contract the loop reads, and the
    # algorithms against theirs.
    assert all(issubclass(c, EnvTrainer) for c in (Fused, SeedBatch, Staged, Host))
    assert all(issubclass(c, Algorithm) for c in (PPO, OffPolicy))


# ---------------------------------------------------- placement equality
LAYOUTS = {
    "fused": [],
    "collocated": ["flow.runner=staged", "flow.num_micro_batches=2"],
    "disaggregated": ["cluster.component_placement=disaggregated"],
    "hybrid": ["cluster.component_placement=hybrid", "flow.num_micro_batches=2"],
    "explicit": ["cluster.component_placement={env: 0-1, rollout: 2-5, actor: 1-6}", "cluster.mesh.actor={data: 3, fsdp: 2}"],
    # The update on the rollout's devices and the actor's (2-7), the state moved there and back.
    "dynamic": ["cluster.component_placement=disaggregated", "cluster.scaling=dynamic"],
}


def _three_iterations(overrides):
    trainer = build_trainer(load_config("ppo_brax", overrides))
    state = trainer.init()
    if isinstance(trainer, Fused):
        state, sums = trainer.run_chunk(state, jnp.int32(3))
    else:
        state, sums = trainer.run_iterations(state, 3)
    return trainer, trainer.summarize(sums, 3), jax.device_get(trainer.snapshot(state))


# ------------------------------------------------------------ final values
@pytest.mark.parametrize(
    "truncated_at",
    [
        [(1, 0), (3, 2)],  # within the bound: only those rows go through the critic
        [(t, b) for t in range(4) for b in range(3)],  # more than the bound: the full pass
        [],  # none: no pass
    ],
)
def test_final_values_bootstrap_exactly_the_truncated_rows(truncated_at):
    T, B = 4, 3
    rng = np.random.default_rng(0)
    final_obs = rng.normal(size=(T, B, 5)).astype(np.float32)
    truncated = np.zeros((T, B), np.float32)
    for t, b in truncated_at:
        truncated[t, b] = 1.0
    traj = SimpleNamespace(
        reward=jnp.zeros((T, B)), truncated=jnp.asarray(truncated), final_obs=jnp.asarray(final_obs)
    )
    # Episodes of 4 sub-steps in chunks of 2: at most ceil(4 / 2) = 2 truncations per env.
    k = ppo.max_truncations(T, B, episode_length=4, substeps=2)
    assert k == 6
    weights = rng.normal(size=5).astype(np.float32)
    critic = lambda o: jnp.tanh(o @ weights)  # noqa: E731
    got = np.asarray(ppo.final_values(critic, traj, k)).reshape(T, B)
    want = np.array(
        [[np.tanh(final_obs[t, b] @ weights) if truncated[t, b] else 0.0 for b in range(B)] for t in range(T)]
    )
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
@pytest.mark.devices(8)
def test_collocated_disaggregated_and_hybrid_give_the_same_numbers():
    # 8 fake CPU devices; 48 envs split over 2 micro-batches and meshes of 2..8 devices.
    base = [*TINY, "env.num_envs=48", "env.num_eval_envs=48"]
    out = {name: _three_iterations(base + extra) for name, extra in LAYOUTS.items()}
    assert isinstance(out["fused"][0], Fused) and isinstance(out["fused"][0].algorithm, PPO)
    assert {k: t.placement.mode for k, (t, _, _) in out.items() if k != "fused"} == {
        "collocated": "collocated",
        "disaggregated": "disaggregated",
        "hybrid": "hybrid",
        "explicit": "hybrid",
        "dynamic": "disaggregated",
    }
    dynamic = out["dynamic"][0]
    assert dynamic.placement.phases["update"].devices == (2, 3, 4, 5, 6, 7)
    assert dynamic.flow_stats()["time/switch_s"] > 0
    _, ref_metrics, ref = out["fused"]
    for name, (_, metrics, snap) in out.items():
        np.testing.assert_array_equal(snap.key, ref.key, err_msg=name)
        # Differently sized actor meshes sum gradients in a different order; that drift
        # (~1e-5) reaches the actions of later iterations, nothing else differs. A wrong
        # key scheme or a reordered batch would show as O(1) differences here.
        np.testing.assert_allclose(snap.env_state.obs, ref.env_state.obs, rtol=1e-3, atol=1e-3, err_msg=name)
        for a, b in zip(jax.tree.leaves(snap.params), jax.tree.leaves(ref.params)):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=2e-4, err_msg=name)
        # Every train/*, env/* and rollout/* metric the first logged row holds (the loop
        # logs exactly this summary of the chunk), to 1e-3 relative.
        assert metrics.keys() == ref_metrics.keys(), name
        assert {k.split("/")[0] for k in metrics} == {"train", "env", "rollout"}
        for key, value in ref_metrics.items():
            np.testing.assert_allclose(metrics[key], value, rtol=1e-3, atol=1e-7, err_msg=f"{name} {key}")


# -------------------------------------------------------- runs and resume
def _cfg(tmp_path, name, *extra):
    return load_config(
        "ppo_brax",
        [*TINY, f"runner.output_dir={tmp_path}", f"runner.experiment_name={name}", "runner.log_interval=1", *extra],
    )


def _comparable(records):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


@pytest.mark.slow
def test_staged_run_resumes_exactly_and_accounts_staleness(tmp_path):
    staged = ["flow.runner=staged", "flow.num_micro_batches=2", "runner.save_interval=2", "runner.eval_interval=2"]
    run(_cfg(tmp_path, "straight", *staged, "runner.max_steps=4"))
    run(_cfg(tmp_path, "split", *staged, "runner.max_steps=2"))
    summary = run(_cfg(tmp_path, "split", *staged, "runner.max_steps=4", "runner.resume=auto"))
    assert summary.resumed_from == 2
    a = _comparable(read_metrics(tmp_path / "straight" / "metrics.jsonl"))
    b = _comparable(read_metrics(tmp_path / "split" / "metrics.jsonl"))
    assert a == b
    assert all(r["flow/staleness_max"] == 0 for r in a if "flow/staleness_max" in r)

    # One version of lag: every update after the first trains on the previous policy's data.
    run(_cfg(tmp_path, "stale", "flow.max_staleness=1", "runner.max_steps=4", "runner.eval_interval=4"))
    records = [r for r in read_metrics(tmp_path / "stale" / "metrics.jsonl") if "flow/staleness_max" in r]
    assert [r["flow/staleness_max"] for r in records] == [0, 1, 1, 1]
    assert records[-1]["flow/staleness_mean"] == pytest.approx(3 / 4)
    placement = json.loads((tmp_path / "stale" / "placement.json").read_text())
    assert placement["mode"] == "collocated"
    # Its checkpoint holds the parameters its next rollout acts with (one iteration old), so
    # stopped at 2 and resumed it gives the uninterrupted run's numbers, lag included.
    stale = ["flow.max_staleness=1", "runner.eval_interval=4", "runner.save_interval=2"]
    run(_cfg(tmp_path, "stale_split", *stale, "runner.max_steps=2"))
    assert run(_cfg(tmp_path, "stale_split", *stale, "runner.max_steps=4", "runner.resume=auto")).resumed_from == 2
    resumed = [r for r in read_metrics(tmp_path / "stale_split" / "metrics.jsonl") if "flow/staleness_max" in r]
    assert [r["flow/staleness_max"] for r in resumed] == [0, 1, 1, 1]
    # (The first run's final evaluation at step 2 is the one record of its own.)
    no_eval = lambda rs: [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in _comparable(rs)]  # noqa: E731
    assert no_eval(resumed) == no_eval(records)
    # One chunk of four iterations enqueues each next rollout before the update it overlaps:
    # the same numbers as four chunks of one.
    run(_cfg(tmp_path, "stale_chunk", "flow.max_staleness=1", "runner.max_steps=4", "runner.eval_interval=4",
             "runner.log_interval=4"))
    (chunk,) = [r for r in read_metrics(tmp_path / "stale_chunk" / "metrics.jsonl") if "flow/staleness_max" in r]
    for key in ("train/policy_loss", "train/value_loss", "rollout/reward_mean"):
        assert chunk[key] == pytest.approx(np.mean([r[key] for r in records]), rel=1e-5), key
    assert chunk["flow/staleness_mean"] == pytest.approx(3 / 4)


@pytest.mark.slow
@pytest.mark.devices(4)
def test_dynamic_scaling_resumes_exactly_and_logs_its_switches(tmp_path):
    # env and rollout on devices 0-1, the actor on 2-3 ({fsdp: 2}); the update on all four ({fsdp: 4}).
    dynamic = ["cluster.component_placement={env: 0-1, rollout: 0-1, actor: 2-3}", "cluster.mesh.actor={fsdp: 2}",
               "cluster.scaling=dynamic", "runner.save_interval=2", "runner.eval_interval=2"]
    run(_cfg(tmp_path, "straight", *dynamic, "runner.max_steps=4"))
    run(_cfg(tmp_path, "split", *dynamic, "runner.max_steps=2"))
    assert run(_cfg(tmp_path, "split", *dynamic, "runner.max_steps=4", "runner.resume=auto")).resumed_from == 2
    straight = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    assert _comparable(straight) == _comparable(read_metrics(tmp_path / "split" / "metrics.jsonl"))
    assert all(r["time/switch_s"] > 0 for r in straight if "train/loss" in r)
    phases = json.loads((tmp_path / "straight" / "placement.json").read_text())["phases"]
    assert phases == {"update": {"devices": [0, 1, 2, 3], "mesh_shape": {"fsdp": 4}, "axis_names": ["fsdp"]}}


@pytest.mark.devices(2)
def test_dynamic_scaling_where_it_cannot_work_is_one_error_line(tmp_path, capsys):
    from rlinf_jax.cli.train import main

    for argv, fragment in [
        ([*TINY, "cluster.component_placement=hybrid"], "already runs on all of them"),
        ([*TINY, "cluster.component_placement=disaggregated", "flow.max_staleness=1"], "set flow.max_staleness=0"),
        (TINY, "a collocated run has every component on every device"),
        (["--config-name", "sac_brax", "cluster.component_placement=disaggregated"], "no idle phase"),
        (["--config-name", "sft_math", "cluster.component_placement={actor: 0-1}"], "supervised fine-tuning has one"),
        ([*TINY, "cluster.component_placement={env: 0, rollout: 0, actor: 1}", "env.num_envs=15",
          "algorithm.num_minibatches=1"], "env.num_envs=15 does not split over them"),
    ]:
        assert main([*argv, f"runner.output_dir={tmp_path}", "cluster.scaling=dynamic"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and fragment in err and "\n" not in err, (fragment, err)


def test_fused_runner_refuses_a_pipelined_layout(tmp_path):
    from rlinf_jax.errors import BadInput

    with pytest.raises(BadInput, match="flow.runner=fused needs a collocated placement"):
        build_trainer(_cfg(tmp_path, "x", "flow.runner=fused", "flow.max_staleness=1"))


# ------------------------------------------------------------- auto-placement
def _env_steps_per_sec(trainer, iterations: int = 4) -> float:
    state = trainer.init()
    trainer.compile(state, jax.random.PRNGKey(0))
    state, sums = trainer.run_iterations(state, 1)
    trainer.summarize(sums, 1)
    t0 = time.perf_counter()
    state, sums = trainer.run_iterations(state, iterations)
    trainer.summarize(sums, iterations)
    return iterations * trainer.env_steps_per_iteration / (time.perf_counter() - t0)


@pytest.mark.slow
@pytest.mark.devices(2)
def test_auto_placement_picks_the_faster_layout():
    cfg = load_config("ppo_brax", [*TINY, "algorithm.rollout_length=32"])
    # Built so one layout is clearly faster: a tiny policy and env, where the hybrid layout's
    # per-step hand-offs between the env and rollout devices cost far more than the compute.
    cands = [
        Candidate("hybrid", {"env": "0", "rollout": "1", "actor": "0-1"}, 2),
        Candidate("collocated", {"env,rollout,actor": "0-1"}),
    ]
    # Alone the collocated layout is predicted 1.7-2.2x faster; in the suite the other worker's
    # load once slowed its three timed runs (0.2 s in all) enough to pick the hybrid: the
    # fastest of ten spans more of the other worker's pauses.
    plan = auto_placement(cfg, make_setup(cfg), 2, cands, repeats=10)
    measured = {prof.candidate.name: _env_steps_per_sec(t) for prof, t in zip(plan.profiles, plan.trainers)}
    summary = plan.to_json()
    assert summary["chosen"] == "collocated" and plan.placement.mode == "collocated"
    assert max(measured, key=measured.get) == "collocated", measured
    predicted = {c["name"]: c["predicted_env_steps_per_sec"] for c in summary["candidates"]}
    assert predicted["collocated"] > predicted["hybrid"]
    assert summary["predicted_env_steps_per_sec"] == predicted["collocated"]
    # The dynamic candidate is profiled with its moves: its placement borrows the rollout's device.
    prof, trainer = profile(cfg, make_setup(cfg), Candidate("d", {"env,rollout": "0", "actor": "1"}, 1, "dynamic"), 2)
    assert trainer.placement.phases["update"].devices == (0, 1) and prof.to_json()["scaling"] == "dynamic"
    assert prof.learn_ms > 0 and trainer.flow_stats() == {}


def test_auto_placement_weighs_dynamic_scaling_where_the_run_is_on_policy():
    names = lambda *a: [c.name for c in candidates(*a)]  # noqa: E731
    assert names(1, 16) == ["collocated"]
    assert names(2, 16) == ["collocated", "disaggregated", "disaggregated-dynamic", "hybrid"]
    assert names(8, 16, 1) == ["collocated", "disaggregated", "disaggregated-3way", "hybrid"]
    assert [c.scaling for c in candidates(8, 16)] == ["static", "static", "dynamic", "static", "dynamic", "static"]


def test_auto_placement_run_records_plan_prediction_and_measurement(tmp_path):
    cfg = _cfg(tmp_path, "auto", "cluster.component_placement=auto", "runner.max_steps=2", "runner.eval_interval=2")
    run(cfg)
    placement = json.loads((tmp_path / "auto" / "placement.json").read_text())
    auto = placement["auto"]
    assert auto["chosen"] == "collocated"  # the only layout on one device
    assert auto["measured_env_steps_per_sec"] > 0 and "prediction_error" in auto
    first = read_metrics(tmp_path / "auto" / "metrics.jsonl")[1]
    assert first["placement/measured_env_steps_per_sec"] == pytest.approx(auto["measured_env_steps_per_sec"], rel=1e-3)
    assert first["placement/predicted_env_steps_per_sec"] == pytest.approx(auto["predicted_env_steps_per_sec"], rel=1e-3)


def test_offloaded_optimizer_state_waits_in_host_memory_and_changes_nothing(tmp_path):
    results = []
    for offload in ("false", "true"):
        trainer = build_trainer(_cfg(tmp_path, "o", "flow.runner=staged", f"flow.offload_optimizer={offload}"))
        state, sums = trainer.run_iterations(trainer.init(), 2)
        kinds = {x.sharding.memory_kind for x in jax.tree.leaves(state.learner.opt_state)}
        assert kinds == ({"pinned_host"} if offload == "true" else {"device"})
        results.append((trainer.summarize(sums, 2), jax.tree.leaves(jax.device_get(trainer.snapshot(state)))))
    assert results[0][0] == results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("cluster.component_placement={env: 0-3, rollout: 0, actor: 0}", "out of range"),
        ("cluster.component_placement={env: 0, rollout: 0}", "no devices for actor"),
        ("cluster.component_placement={env: 0, rollout: 0, actor: 0, critic: 0}", "unknown component 'critic'"),
        ("cluster.mesh.actor={data: 2}", "make the axis sizes multiply to 1"),
        ("cluster.component_placement=disaggregated", "3 component(s) to split over 1"),
    ],
)
def test_bad_placements_at_the_cli_are_one_line_exit_2(tmp_path, capsys, override, fragment):
    from rlinf_jax.cli.train import main

    assert main([*TINY, f"runner.output_dir={tmp_path}", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and fragment in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing written

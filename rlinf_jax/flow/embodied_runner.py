"""The host loop of an embodied PPO run: chunks of iterations, eval, checkpoints.

The flow is the fused `PPOTrainer` (a chunk of iterations is one jit) or the staged
`StagedPPO` (stages on component meshes), chosen from the placement; both offer the
same small interface (init/start/snapshot/compile/run_iterations/run_eval). The host
only wakes at chunk boundaries, which sit at multiples of the log / eval / save intervals counted
from step 0. Boundaries therefore do not depend on where a run was resumed, which is
what makes a killed-and-resumed run end with exactly the same numbers.

In a multi-host run every process runs this loop; only process 0 writes the run
directory's files for people (config.yaml, placement.json, metrics, TensorBoard) and
prints, while checkpoints are saved and restored by all processes together.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import jax

from rlinf_jax.config.schema import Config
from rlinf_jax.envs import make_env, make_eval_env
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.embodied_ppo import PPOTrainer
from rlinf_jax.runtime import Checkpointer, MetricsLogger, RunDir, resolve_resume
from rlinf_jax.runtime.distributed import barrier, is_multiprocess, is_primary, local_devices_first
from rlinf_jax.runtime.progress import progress_bar
from rlinf_jax.sharding import Placement, component_mesh, resolve_num_devices, resolve_placement
from rlinf_jax.sharding.mesh import fetch, spans_all_processes

EMBODIED_COMPONENTS = ("env", "rollout", "actor")


class TrainingDiverged(RuntimeError):
    """Updates kept producing non-finite losses or gradients; the run stopped."""


@dataclass
class RunSummary:
    run_dir: Path
    steps: int
    env_steps: int
    eval_return: float | None
    env_steps_per_sec: float
    compile_sec: float
    wall_sec: float
    resumed_from: int | None


def next_boundary(step: int, cfg: Config) -> int:
    r = cfg.runner
    candidates = [r.max_steps]
    for interval in (r.log_interval, r.eval_interval, r.save_interval):
        if interval > 0:
            candidates.append((step // interval + 1) * interval)
    return min(candidates)


def _due(step: int, interval: int, final: bool) -> bool:
    return final or (interval > 0 and step % interval == 0)


def enable_compilation_cache(directory: str) -> None:
    if directory:
        jax.config.update("jax_compilation_cache_dir", str(Path(directory).expanduser()))
        # Only programs worth caching: the fused iteration and the eval loop, not tiny ops.
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def resolve_embodied_placement(cfg: Config, num_devices: int) -> Placement:
    return resolve_placement(cfg.cluster.component_placement, EMBODIED_COMPONENTS, num_devices, cfg.cluster.mesh)


def build_trainer(cfg: Config, placement: Placement | None = None, log=None):
    """The flow for ``cfg``: the fused single-jit trainer where it applies, else staged.

    Fused needs everything collocated, strictly on-policy and one micro-batch; it is the
    fastest layout for small policies. Anything else runs as stages (`StagedPPO`).
    """
    from rlinf_jax.flow.embodied_staged import StagedPPO

    with local_devices_first():
        env = make_env(cfg.env)
        eval_env = make_eval_env(cfg.env)
    num_devices = resolve_num_devices(cfg.cluster.num_devices)
    devices = jax.devices()[:num_devices]
    if placement is None:
        if cfg.cluster.component_placement == "auto" and is_multiprocess():
            # Each process would time the candidates itself and might pick another one.
            raise BadInput(
                "cluster.component_placement=auto is not available in multi-host runs yet; "
                "name a preset (collocated, disaggregated, hybrid) or a mapping"
            )
        if cfg.cluster.component_placement == "auto":
            from rlinf_jax.flow.auto_placement import auto_placement

            plan = auto_placement(cfg, num_devices, log=log)
            if log:
                log(f"auto-placement: chose {plan.chosen.candidate.name} ({plan.placement.mode}) after {plan.profile_sec:.1f} s of profiling")
            plan.trainer.auto_plan = plan
            return plan.trainer
        placement = resolve_embodied_placement(cfg, num_devices)
    f = cfg.flow
    fusable = placement.mode == "collocated" and f.num_micro_batches == 1 and f.max_staleness == 0
    if f.runner == "fused" and not fusable:
        raise BadInput(
            f"flow.runner=fused needs a collocated placement, flow.num_micro_batches=1 and flow.max_staleness=0 "
            f"(got {placement.mode}, {f.num_micro_batches}, {f.max_staleness}); use flow.runner=auto"
        )
    if f.runner == "fused" or (f.runner == "auto" and fusable):
        trainer = PPOTrainer(cfg, env, eval_env, component_mesh(placement, "actor", devices))
    else:
        trainer = StagedPPO(cfg, env, eval_env, placement, devices)
    trainer.placement = placement
    trainer.auto_plan = None
    return trainer


def _write_placement(trainer, path: Path, measured: float | None = None) -> None:
    info = trainer.placement.to_json()
    info["runner"] = type(trainer).__name__
    info["num_micro_batches"] = trainer.cfg.flow.num_micro_batches
    info["max_staleness"] = trainer.cfg.flow.max_staleness
    if trainer.auto_plan is not None:
        info["auto"] = trainer.auto_plan.to_json()
        if measured is not None:
            predicted = trainer.auto_plan.chosen.predicted_env_steps_per_sec
            info["auto"]["measured_env_steps_per_sec"] = round(measured, 1)
            info["auto"]["prediction_error"] = round(predicted / measured - 1.0, 4)
    path.write_text(json.dumps(info, indent=2) + "\n")


def _checkpoint_view(snapshot):
    """What a checkpoint holds of ``snapshot`` (and what a restore reads into).

    One process: the snapshot itself. Several: orbax writes an array that spans every
    process shard by shard from all of them, so no host ever holds the whole state; an
    array that only some processes hold (a component placed on some hosts) is one orbax
    cannot write, and it goes through the host instead.
    """
    if not is_multiprocess():
        return snapshot
    leaves, treedef = jax.tree.flatten(snapshot)
    partial = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and not spans_all_processes(x)]
    for i, value in zip(partial, fetch([leaves[i] for i in partial])):
        leaves[i] = value
    return jax.tree.unflatten(treedef, leaves)


def _checkpoint_state(trainer, state):
    snapshot = trainer.snapshot(state)
    return _checkpoint_view(snapshot) if is_multiprocess() else jax.device_get(snapshot)


def run(cfg: Config, console=None) -> RunSummary:
    """Trains (or resumes) the run that ``cfg`` describes and returns its summary."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    primary = is_primary()
    log = console.print if console is not None and cfg.runner.progress_bar and primary else None
    trainer = build_trainer(cfg, log=log)
    run_dir = RunDir.from_config(cfg)
    resume_path = resolve_resume(cfg, run_dir)
    if resume_path is None and cfg.runner.resume == "none" and run_dir.has_checkpoints():
        raise BadInput(
            f"{run_dir.path} already holds checkpoints; pass runner.resume=auto to continue that run "
            "or choose another runner.experiment_name"
        )

    state = trainer.init()
    resumed_from = None
    # Restore before anything is written: a bad checkpoint must leave the run dir untouched.
    if resume_path is not None:
        ckpt_dir, step = resume_path
        target = _checkpoint_view(trainer.snapshot(state))
        ts, _ = Checkpointer(ckpt_dir, keep=cfg.runner.keep_checkpoints).restore(step, target)
        state = trainer.start(ts)
        resumed_from = trainer.progress(state)[0]

    if primary:
        run_dir.create(cfg)
        _write_placement(trainer, run_dir.path / "placement.json")
    logger = MetricsLogger(run_dir, tensorboard=cfg.runner.tensorboard, write=primary)
    checkpointer = Checkpointer(run_dir.checkpoints, keep=cfg.runner.keep_checkpoints)
    if resumed_from is not None:
        # What was logged or saved after the resume point belongs to a future this run rewrites.
        logger.truncate_after(resumed_from)
        checkpointer.delete_after(resumed_from)
    elif cfg.runner.resume == "auto":
        # Nothing to resume: a run that died before its first checkpoint (a restarted
        # multi-host job) starts over, and what it logged belongs to no future.
        logger.truncate_after(-1)

    t0 = time.perf_counter()
    eval_key = jax.random.PRNGKey(cfg.runner.seed + 1)
    trainer.compile(state, eval_key)
    compile_sec = time.perf_counter() - t0
    barrier("compiled")  # hosts compile at their own pace; the first chunk runs in step

    step = trainer.progress(state)[0]
    start_step = step
    train_sec = 0.0
    last_eval = None
    try:
        show = cfg.runner.progress_bar and primary
        with progress_bar(cfg.runner.max_steps, step, enabled=show, console=console) as bar:
            plan = trainer.auto_plan
            if step == 0:
                first = {"time/compile_sec": compile_sec}
                if plan is not None:
                    first["placement/predicted_env_steps_per_sec"] = plan.chosen.predicted_env_steps_per_sec
                    first["time/placement_profile_sec"] = plan.profile_sec
                logger.log(0, first)
            while step < cfg.runner.max_steps:
                target = next_boundary(step, cfg)
                n = target - step
                t0 = time.perf_counter()
                state, sums = trainer.run_iterations(state, n)
                metrics = trainer.summarize(sums, n)  # blocks until the chunk is done
                metrics.update(trainer.flow_stats())
                dt = time.perf_counter() - t0
                train_sec += dt
                step_before, step = step, target
                final = step == cfg.runner.max_steps
                metrics["time/env_steps_per_sec"] = n * trainer.env_steps_per_iteration / dt
                if plan is not None and step_before == start_step:
                    # The plan's prediction next to what the first chunk actually ran at.
                    metrics["placement/predicted_env_steps_per_sec"] = plan.chosen.predicted_env_steps_per_sec
                    metrics["placement/measured_env_steps_per_sec"] = metrics["time/env_steps_per_sec"]
                    if primary:
                        _write_placement(trainer, run_dir.path / "placement.json", metrics["time/env_steps_per_sec"])
                metrics["env/steps"] = step * trainer.env_steps_per_iteration

                bad_iterations = trainer.progress(state)[1]
                if bad_iterations >= cfg.runner.max_nonfinite_updates:
                    logger.log(step, metrics)
                    raise TrainingDiverged(
                        f"{bad_iterations} iterations in a row produced non-finite losses or "
                        f"gradients (skipped, parameters untouched); stopped at step {step}. Lower "
                        "actor.optim.lr or check the env's rewards/observations; the last good "
                        f"checkpoint is in {run_dir.checkpoints}"
                    )
                if _due(step, cfg.runner.eval_interval, final):
                    t0 = time.perf_counter()
                    ev = fetch(trainer.run_eval(state, jax.random.fold_in(eval_key, step)))
                    metrics.update({k: float(v) for k, v in ev.items()})
                    metrics["time/eval_sec"] = time.perf_counter() - t0
                    last_eval = metrics["eval/return"]
                if _due(step, cfg.runner.log_interval, final) or "eval/return" in metrics:
                    logger.log(step, metrics)
                if _due(step, cfg.runner.save_interval, final):
                    checkpointer.save(step, _checkpoint_state(trainer, state), {"step": step})
                bar.update(step, metrics)
    finally:
        logger.close()

    ran = step - start_step
    return RunSummary(
        run_dir=run_dir.path,
        steps=step,
        env_steps=step * trainer.env_steps_per_iteration,
        eval_return=last_eval,
        env_steps_per_sec=ran * trainer.env_steps_per_iteration / train_sec if train_sec else 0.0,
        compile_sec=compile_sec,
        wall_sec=time.perf_counter() - t_start,
        resumed_from=resumed_from,
    )

"""An embodied PPO run as programs for the planner (`rlinf_jax.flow.plan`): the fused
runner's two programs (`Fused` over `PPO`), the very jitted functions it calls, on the target's
devices:

- ``iteration``: one PPO iteration in one program (`ppo.run_chunk` for one iteration: the
  env batch stepped ``algorithm.rollout_length`` times, values and advantages, then
  ``update_epochs`` x ``num_minibatches`` clipped PPO steps);
- ``evaluate``: one deterministic episode per eval env, called every ``runner.eval_interval``
  iterations (so a fraction of a call per iteration), every episode assumed to run to the
  time limit (the worst case: the loop stops when every episode is over).

The trainer is built as a run builds it, with the envs (a JAX simulator's model arrays on
the host CPU, where nothing runs) and the policy's parameters as shapes alone; its state is
`jax.eval_shape` of the trainer's own fresh state, laid out with the shardings its `place`
gives. Nothing is allocated on the target's chips, and no warm start runs (it changes the
parameters' values, not their shapes).

Only the fused, collocated trainer is planned: a placement that runs as stages
(disaggregated, hybrid, or collocated with several micro-batches or staleness) is refused
in one line, and so is a host simulator, which steps outside any TPU program.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from rlinf_jax.config.schema import Config
from rlinf_jax.envs.host.suite import is_host_suite
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.plan import NotPlanned, Program, Resident, fused_layout, laid_out, with_unrolled_twins
from rlinf_jax.rollout import unroll
from rlinf_jax.sharding.mesh import replicated
from rlinf_jax.tasks.embodied import ppo
from rlinf_jax.tasks.embodied.setup import make_setup
from rlinf_jax.flow.stage import COMPONENTS
from rlinf_jax.tasks.embodied.algorithm import PPO

COMPONENT = "collocated"  # env, rollout and actor share every chip: one component to the planner


def programs(cfg: Config, devices, twins: bool = True) -> tuple[list[Program], list[Resident], list[str]]:
    """The fused trainer's programs for the run ``cfg`` describes, laid out on ``devices``,
    the state that stays resident between them, and notes on what was assumed. A VLA with
    scanned layers carries its unrolled twins, where the planner counts FLOPs (``twins=False``:
    memory only)."""
    return with_unrolled_twins(_programs, cfg, devices, twins)


def _programs(cfg: Config, devices) -> tuple[list[Program], list[Resident], list[str]]:
    e = cfg.env
    if is_host_suite(e):
        raise NotPlanned(
            f"planning an embodied run on a host simulator (env.suite={e.suite}) is not supported: its envs step in "
            "worker processes on the host's CPUs, outside any program a TPU runs"
        )
    placement, mesh = fused_layout(cfg, COMPONENTS, devices, "an embodied run")
    setup = make_setup(cfg, abstract=True)
    algorithm = PPO(cfg, setup, mesh)  # checks that the env batches split over the mesh
    trainer = Fused(algorithm)
    state = jax.eval_shape(algorithm.state_around, setup.params)
    state = laid_out(state, algorithm.shardings(state))
    rep = replicated(mesh)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep)
    s = algorithm.learner.settings

    n_params = int(sum(x.size for x in jax.tree.leaves(setup.params)))
    B, T = algorithm.env.num_envs, s.rollout_length
    # The policy's own FLOPs, counting every parameter (policy and value networks) per
    # sample: a forward pass on every step of the rollout, forward and backward on every
    # sample of every epoch. The simulator's work is no model's.
    # A VLA's sample is hundreds of tokens through each of its towers and LMs (and pi0's
    # expert at every denoising step): not counted yet, so no utilisation is claimed.
    train_flops = 2.0 * n_params * B * T * (1 + 3 * s.update_epochs) if cfg.actor.model.kind == "mlp" else 0.0
    iteration = Program(
        COMPONENT, "iteration", trainer.run_chunk, (state, jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)),
        model_flops=train_flops, holds=("policy", "optimizer", "env state"),
        more=_iteration_loops(algorithm, state, key),
    )
    # Episodes end at the time limit, counted in policy steps (of `algorithm.substeps` sub-steps each).
    steps = max(1, -(-e.episode_length // algorithm.substeps))
    every = cfg.runner.eval_interval or cfg.runner.max_steps
    # The trainer's evaluation, with every parameter kept as an argument: jit would drop the
    # ones a deterministic policy never reads (a critic's), which stay on the chips all the same.
    evaluate = Program(COMPONENT, "evaluate", jax.jit(algorithm.evaluate, keep_unused=True),
                       (state.params, state.obs_stats, key),
                       calls=1.0 / max(1, every), loop_trips=steps, holds=("policy",))
    residents = [
        Resident(COMPONENT, "policy", (state.params, state.obs_stats)),
        Resident(COMPONENT, "optimizer", state.opt_state),
        Resident(COMPONENT, "env state", (state.env_state, state.key, state.step, state.bad_iterations)),
    ]
    notes = [
        f"{cfg.actor.model.kind} policy of {n_params:,} parameters on {e.suite} {e.name} ({e.backend}), "
        f"env, rollout and actor collocated on {len(devices)} chip(s) {dict(placement.components['actor'].mesh_shape)}"
        " (the fused runner)",
        f"an iteration: {B} envs x {T} steps ({algorithm.env_steps_per_iteration:,} env steps), then {s.update_epochs} "
        f"epochs of {s.num_minibatches} minibatches of {s.minibatch_size}",
        f"evaluation: {algorithm.eval_env.num_envs} envs for up to {steps} steps each (every episode to the time limit), "
        + (f"every {every} iterations" if cfg.runner.eval_interval else "once, after the last iteration"),
        "FLOPs and bytes count every env step and every minibatch, but the simulator's own inner loops (a Brax "
        "step's frames, its solver's iterations) once per step: the env's share is a lower bound",
        "model FLOPs (the utilisation) count every parameter per sample, in the iteration only"
        if cfg.actor.model.kind == "mlp" else
        f"no utilisation: the model FLOPs of a {cfg.actor.model.kind} policy's tokens are not counted yet",
    ]
    if cfg.sft.warm_start_steps > 0 or (cfg.actor.model.kind == "vla" and cfg.actor.model.path):
        notes.append("the warm start before the first iteration is not planned")
    return [iteration, evaluate], residents, notes


def _iteration_loops(algorithm: PPO, state, key) -> tuple:
    """The iteration's loop trips beyond the one the compiler costs: every other env step of
    the rollout, and every other minibatch step of the update."""
    learner, s = algorithm.learner, algorithm.learner.settings

    def rollout(length: int):
        return jax.jit(lambda ts, k: unroll(algorithm.env, ppo.acting(learner, ts.params, ts.obs_stats), ts.env_state,
                                            k, length))

    traj = jax.eval_shape(rollout(s.rollout_length), state, key)[1]
    # One minibatch of the trajectory, as `ppo.update` reshapes it: [1, minibatch, ...].
    mb = jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, s.minibatch_size, *x.shape[2:]), x.dtype), traj)
    column = jax.ShapeDtypeStruct((1, s.minibatch_size), jnp.float32)
    one_step = dataclasses.replace(learner, settings=dataclasses.replace(
        s, update_epochs=1, num_minibatches=1, batch_size=s.minibatch_size))
    sgd = jax.jit(functools.partial(ppo.update, one_step))
    return (
        (rollout(1), (state, key), s.rollout_length - 1),
        (sgd, (state.params, state.opt_state, state.obs_stats, mb, column, column, key),
         s.update_epochs * s.num_minibatches - 1),
    )

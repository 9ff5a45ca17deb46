"""An off-policy run (SAC, CrossQ, RLPD, IQL) as programs for the planner
(`rlinf_jax.flow.plan`): the fused runner's two programs (`Fused` over `OffPolicy`), the very
jitted functions it calls, on the target's devices:

- ``iteration``: one iteration in one program (`learner.run_chunk` for one iteration:
  ``algorithm.rollout_length`` x (a batched env step, its transitions into the replay
  buffer, ``algorithm.offpolicy.utd_ratio`` gradient steps on sampled batches));
- ``evaluate``: one deterministic episode per eval env, every ``runner.eval_interval``
  iterations, every episode assumed to run to the time limit.

The state is `jax.eval_shape` of the trainer's own fresh state (the networks, their
optimisers, the env batch and the whole replay buffer, whose rows split over the chips
with the envs that wrote them), laid out with the shardings its `place` gives. The
networks are small enough to build for real on the host; nothing runs on the target.

Only the fused, collocated trainer is planned: a staged placement (disaggregated, hybrid,
staleness) and a host simulator are refused in one line, as for embodied PPO.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from rlinf_jax.config.schema import Config
from rlinf_jax.envs.host.suite import is_host_suite
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.plan import NotPlanned, Program, Resident, fused_layout, laid_out, param_count
from rlinf_jax.sharding.mesh import replicated
from rlinf_jax.tasks.offpolicy import learner as lib
from rlinf_jax.flow.stage import COMPONENTS
from rlinf_jax.tasks.offpolicy.setup import make_setup
from rlinf_jax.tasks.offpolicy.algorithm import OffPolicy

COMPONENT = "collocated"  # env, rollout, actor and the replay buffer share every chip


def programs(cfg: Config, devices) -> tuple[list[Program], list[Resident], list[str]]:
    """The fused trainer's programs for the run ``cfg`` describes, laid out on ``devices``,
    the state that stays resident between them, and notes on what was assumed."""
    e, a = cfg.env, cfg.algorithm
    if is_host_suite(e):
        raise NotPlanned(
            f"planning an off-policy run on a host simulator (env.suite={e.suite}) is not supported: its envs step "
            "in worker processes on the host's CPUs, outside any program a TPU runs"
        )
    placement, mesh = fused_layout(cfg, COMPONENTS, devices, "an off-policy run")
    setup = make_setup(cfg)
    algorithm = OffPolicy(cfg, setup, mesh)  # checks that the env batches split over the mesh
    trainer = Fused(algorithm)
    state = jax.eval_shape(algorithm.fresh_state)
    state = laid_out(state, algorithm.shardings(state))
    demos = None if algorithm.demos is None else laid_out(algorithm.demos, jax.tree.map(lambda x: x.sharding,
                                                                                    algorithm.demos))
    rep = replicated(mesh)
    s = algorithm.learner.settings
    T, utd, B = s.rollout_length, s.utd_ratio, s.batch_size
    n_actor = param_count(state.actor)
    n_critics = param_count(state.critic) + param_count(state.value)
    # The networks' own FLOPs: the actor acting on every env of every step; per gradient
    # step, forward and backward of the critics on the batch (and their targets' forward on
    # the next observations), and of the actor with the critics' forward on its actions.
    grad_step = 2.0 * B * (3 * n_critics + n_critics + 3 * n_actor + n_critics)
    model_flops = 2.0 * n_actor * s.num_envs * T + grad_step * T * utd
    iteration = Program(
        COMPONENT, "iteration", trainer.run_chunk, (state, demos, jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)),
        model_flops=model_flops, holds=("networks", "optimizers", "replay buffer", "env state"),
        more=_iteration_loops(algorithm, state, demos),
    )
    steps = max(1, -(-e.episode_length // algorithm.substeps))
    every = cfg.runner.eval_interval or cfg.runner.max_steps
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep)
    evaluate = Program(COMPONENT, "evaluate", trainer.evaluate, (state.actor, state.obs_stats, key),
                       calls=1.0 / max(1, every), loop_trips=steps, holds=("networks",))
    nets = (state.actor, state.critic, state.critic_stats, state.target_critic, state.value, state.log_alpha,
            state.obs_stats, state.rollout_actor, state.rollout_stats)
    optimizers = (state.actor_opt, state.critic_opt, state.alpha_opt, state.value_opt)
    residents = [
        Resident(COMPONENT, "networks", nets),
        Resident(COMPONENT, "optimizers", optimizers),
        Resident(COMPONENT, "replay buffer", state.replay),
        Resident(COMPONENT, "env state", (state.env_state, state.key, state.step, state.env_steps, state.grad_steps,
                                          state.bad_iterations)),
    ]
    notes = [
        f"{a.name}: an actor of {n_actor:,} and critics of {n_critics:,} parameters on {e.suite} {e.name} "
        f"({e.backend}), env, rollout, actor and replay collocated on {len(devices)} chip(s) "
        f"{dict(placement.components['actor'].mesh_shape)} (the fused runner)",
        f"an iteration: {T} steps of {s.num_envs} envs ({algorithm.env_steps_per_iteration:,} env steps), each "
        f"followed by {utd} gradient step(s) on batches of {B} ({algorithm.grad_steps_per_iteration} an iteration); "
        f"a replay buffer of {a.offpolicy.replay_size:,} transitions, its rows split with the envs",
        f"evaluation: {algorithm.eval_env.num_envs} envs for up to {steps} steps each (every episode to the time limit), "
        + (f"every {every} iterations" if cfg.runner.eval_interval else "once, after the last iteration"),
        "FLOPs and bytes count every env step and every gradient step, but the simulator's own inner loops once "
        "per step: the env's share is a lower bound",
    ]
    if s.offline_iterations:
        notes.append(f"the first {s.offline_iterations} iterations learn from the dataset alone (no env step): "
                     "planned as online ones")
    return [iteration, evaluate], residents, notes


def _iteration_loops(algorithm: OffPolicy, state, demos) -> tuple:
    """The iteration's loop trips beyond the one the compiler costs: every other step of the
    rollout (an env step, its insert and one gradient step), and every other gradient step."""
    env, learner, s = algorithm.env, algorithm.learner, algorithm.learner.settings
    keys = jax.ShapeDtypeStruct((1, 2), jnp.uint32, sharding=replicated(algorithm.mesh))
    one_step = jax.jit(functools.partial(lib.online_iteration, env, learner))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(algorithm.mesh))
    grad = jax.jit(functools.partial(lib.gradient_steps, learner, n=1))
    return (
        (one_step, (state, demos, keys, keys), s.rollout_length - 1),
        (grad, (state, demos, key), s.rollout_length * (s.utd_ratio - 1)),
    )

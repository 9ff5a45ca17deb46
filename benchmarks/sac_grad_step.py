#!/usr/bin/env python
"""One SAC gradient step in isolation: ours (`sac_step`) vs. Brax's, on the same batches.

`sac_vs_brax.py` times whole trainers (env steps, replay, evaluation). This script takes
the gradient step alone, to tell the update's cost from the loop's: each side runs
``--steps`` gradient steps in one jitted scan over the same fixed batches (no replay
sampling), with the `sac_brax` recipe's sizes (batch 64, two 256x256 critics, a 256x256
actor, learned temperature, Brax's target entropy). Brax's step is assembled from its own
public pieces (`sac.networks`, `sac.losses`, `gradients.gradient_update_fn`) in the order
its trainer runs them: temperature, critic, actor, then the Polyak update.

Also timed: our `gradient_steps`, which adds sampling from a full replay buffer,
observation normalisation and the metrics, i.e. what our trainer runs per step.

Sides alternate over ``--repeats`` rounds; medians. ``--cpus 0`` pins the process to one
core before JAX starts, which shows whether a step uses the second core at all. The last
line is JSON with ``ratio`` = Brax's ms per step / ours (higher is better for us).

    python benchmarks/sac_grad_step.py
    python benchmarks/sac_grad_step.py --cpus 0
    python benchmarks/sac_grad_step.py --matmul mkl --compute-dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=320, help="gradient steps per timed call")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--cpus", default="", help="pin to these cores first, e.g. 0 or 0,1")
    p.add_argument("--matmul", choices=["xla", "mkl"], default="xla",
                   help="our actor's and critics' product backend (actor.model.matmul; mkl: the mkl extra)")
    p.add_argument("--compute-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="our products' dtype (actor.model.compute_dtype); Brax's stay float32")
    p.add_argument("--profile", default="", help="write a jax.profiler trace of our step, and its compiled HLO, to this folder")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from brax.training import gradients, types
    from brax.training.acme import running_statistics
    from brax.training.agents.sac import losses as brax_losses
    from brax.training.agents.sac import networks as brax_networks

    from rlinf_jax.replay import TransitionBatch
    from rlinf_jax.tasks.offpolicy import learner as lib
    from rlinf_jax.tasks.offpolicy import algorithm as off_policy
    from rlinf_jax.tasks.offpolicy.setup import make_setup
    from rlinf_jax.tasks.registry import load_run_config

    n, b = args.steps, args.batch_size
    cfg = load_run_config("sac_brax", ["runner.progress_bar=false", "runner.tensorboard=false",
                                       "algorithm.offpolicy.target_entropy_per_dim=-0.5", f"algorithm.offpolicy.batch_size={b}",
                                       f"actor.model.matmul={args.matmul}",
                                       f"actor.model.compute_dtype={args.compute_dtype}"])
    setup = make_setup(cfg)
    learner = setup.learner
    obs_size, act_size = setup.env.observation_size, setup.env.action_size
    key = jax.random.PRNGKey(0)
    env_state = jax.jit(setup.env.reset)(key)
    state = off_policy.initial_state(cfg, setup, learner, key, env_state,
                                     off_policy.empty_replay(learner, setup, env_state.obs, act_size))
    rng = np.random.default_rng(0)
    batches = TransitionBatch(
        obs=jnp.asarray(rng.normal(size=(n, b, obs_size)), jnp.float32),
        action=jnp.asarray(rng.uniform(-1, 1, (n, b, act_size)), jnp.float32),
        reward=jnp.asarray(rng.normal(size=(n, b)), jnp.float32),
        next_obs=jnp.asarray(rng.normal(size=(n, b, obs_size)), jnp.float32),
        terminated=jnp.zeros((n, b), jnp.float32),
    )

    @jax.jit
    def ours(state, batches, key):
        def body(state, xs):
            state, _, metrics = lib.sac_step(learner, state, *xs)
            return state, metrics["train/critic_loss"]

        return jax.lax.scan(body, state, (batches, jax.random.split(key, n)))

    # The same trainer step with replay sampling: a buffer filled with the batches' rows.
    num_envs = learner.settings.num_envs
    rows = learner.buffer.capacity // num_envs

    def as_rows(x):
        flat = x.reshape(-1, *x.shape[2:])
        flat = jnp.concatenate([flat] * -(-rows * num_envs // flat.shape[0]))[: rows * num_envs]
        return flat.reshape(rows, num_envs, *x.shape[2:])

    fill = jax.tree.map(as_rows, batches)
    full = state.replace(replay=jax.jit(lambda r, t: jax.lax.scan(
        lambda r, step: (learner.buffer.add(r, step), None), r, t)[0])(state.replay, fill))
    ours_sampling = jax.jit(lambda state, key: lib.gradient_steps(learner, state, None, key, n))

    net = brax_networks.make_sac_networks(obs_size, act_size, preprocess_observations_fn=running_statistics.normalize,
                                          hidden_layer_sizes=tuple(cfg.actor.model.policy_hidden_sizes))
    alpha_loss, critic_loss, actor_loss = brax_losses.make_losses(net, cfg.algorithm.reward_scale,
                                                                  cfg.algorithm.gamma, act_size)
    opt = optax.adam(cfg.actor.optim.lr)
    alpha_update = gradients.gradient_update_fn(alpha_loss, opt, pmap_axis_name=None)
    critic_update = gradients.gradient_update_fn(critic_loss, opt, pmap_axis_name=None)
    actor_update = gradients.gradient_update_fn(actor_loss, opt, pmap_axis_name=None)
    k_policy, k_q = jax.random.split(key)
    policy, q = net.policy_network.init(k_policy), net.q_network.init(k_q)
    log_alpha = jnp.zeros(())
    normalizer = running_statistics.init_state(jax.ShapeDtypeStruct((obs_size,), jnp.float32))
    brax_state = dict(policy=policy, q=q, target_q=q, log_alpha=log_alpha, policy_opt=opt.init(policy),
                      q_opt=opt.init(q), alpha_opt=opt.init(log_alpha))
    transitions = types.Transition(
        observation=batches.obs, action=batches.action, reward=batches.reward, discount=1.0 - batches.terminated,
        next_observation=batches.next_obs, extras={"state_extras": {"truncation": jnp.zeros((n, b))}},
    )
    tau = cfg.algorithm.offpolicy.tau

    @jax.jit
    def brax(st, transitions, key):
        def body(carry, t):
            st, key = carry
            key, k_alpha, k_critic, k_actor = jax.random.split(key, 4)
            _, log_alpha, alpha_opt = alpha_update(st["log_alpha"], st["policy"], normalizer, t, k_alpha,
                                                   optimizer_state=st["alpha_opt"])
            alpha = jnp.exp(st["log_alpha"])
            c_loss, q, q_opt = critic_update(st["q"], st["policy"], normalizer, st["target_q"], alpha, t, k_critic,
                                             optimizer_state=st["q_opt"])
            _, policy, policy_opt = actor_update(st["policy"], normalizer, st["q"], alpha, t, k_actor,
                                                 optimizer_state=st["policy_opt"])
            target_q = jax.tree.map(lambda x, y: x * (1 - tau) + y * tau, st["target_q"], q)
            st = dict(policy=policy, q=q, target_q=target_q, log_alpha=log_alpha, policy_opt=policy_opt, q_opt=q_opt,
                      alpha_opt=alpha_opt)
            return (st, key), c_loss

        return jax.lax.scan(body, (st, key), transitions)

    sides = {
        "brax": lambda: brax(brax_state, transitions, key),
        "ours": lambda: ours(state, batches, key),
        "ours_with_sampling": lambda: ours_sampling(full, key),
    }
    for fn in sides.values():
        jax.block_until_ready(fn())
    times = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    if args.profile:
        jax.profiler.start_trace(args.profile)
        jax.block_until_ready(sides["ours"]())
        jax.profiler.stop_trace()
        # The compiled program beside the trace: its op names are the trace's.
        with open(os.path.join(args.profile, "ours.hlo.txt"), "w") as f:
            f.write(ours.lower(state, batches, key).compile().as_text())
    ms = {name: round(statistics.median(t) / n * 1e3, 4) for name, t in times.items()}
    for name, v in ms.items():
        print(f"{name:>20s}: {v:.3f} ms per gradient step")
    cpus = sorted(os.sched_getaffinity(0))
    print(json.dumps({"benchmark": "sac_grad_step", "cpus": cpus, "batch_size": b, "steps": n,
                      "repeats": args.repeats, "matmul": args.matmul, "compute_dtype": args.compute_dtype, "ms_per_step": ms, "ratio": round(ms["brax"] / ms["ours"], 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

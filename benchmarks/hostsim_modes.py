#!/usr/bin/env python
"""Host-simulator PPO, sequential against pipelined: env-steps/s and CPU utilisation.

The workload is ``ppo_gym_mujoco`` on a Gymnasium MuJoCo v5 env (C MuJoCo in env worker
processes, `rlinf_jax.envs.host`) with the same number of workers in both modes:

* ``sequential``: ``flow.num_micro_batches=1``: every worker steps its envs, then the
  policy infers the whole batch, in turn;
* ``pipelined``: ``flow.num_micro_batches=2``: the workers of one half of the batch step
  while the policy infers the other half.

Both give the same numbers (tests/test_hostsim_ppo.py); only the time differs. Each mode
is built and compiled once, then ``--repeats`` rounds alternate the modes, each timing
``--iterations`` whole PPO iterations (rollout + update) and, separately, the rollouts
alone; a mode's figure is the median of its rounds. ``cpu_util`` is the CPU time of this
process and its workers over the wall time (cores kept busy; the machine has
``os.cpu_count()``).

For comparison the same model (the env's own XML) is stepped by MJX, ``vmap``-ed over
the batch inside one jitted scan (``mjx_env_steps_per_sec``, no policy), next to the
worker pool stepping it without a policy (``host_env_steps_per_sec``).

The last stdout line is JSON with ``ratio`` = pipelined / sequential env-steps/s of whole
iterations (``rollout_ratio``: rollouts alone).

    python benchmarks/hostsim_modes.py                       # HalfCheetah-v5, 32 envs, 1 worker
    python benchmarks/hostsim_modes.py --workers 2
    python benchmarks/hostsim_modes.py --env Hopper-v5 --num-envs 64 --repeats 5
    python benchmarks/hostsim_modes.py --workers 1 --policy-cpus 0 --worker-cpus 1   # a core each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.config import load_config
from rlinf_jax.envs.host import HostEnvPool
from rlinf_jax.flow.algorithm import Segment
from rlinf_jax.tasks.embodied.build import build_trainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roofline  # noqa: E402
from recorded import warn_regressions  # noqa: E402


def _cpu_seconds(pids) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def _trainer(args, micro: int):
    overrides = [
        f"env.name={args.env}", f"env.num_envs={args.num_envs}", f"env.num_workers={args.workers}",
        f"flow.num_micro_batches={micro}", f"algorithm.rollout_length={args.rollout_length}",
        "algorithm.num_minibatches=4", "algorithm.update_epochs=1", "env.num_eval_envs=2",
        f"actor.model.policy_hidden_sizes=[{args.hidden},{args.hidden},{args.hidden}]",
        "actor.model.value_hidden_sizes=[256,256]", "runner.progress_bar=false", "env.reset_mode=fresh",
        f"env.worker_cpus=[{','.join(map(str, args.worker_cpus))}]",
    ]
    trainer = build_trainer(load_config("ppo_gym_mujoco", overrides))
    state = trainer.init()
    trainer.compile(state, jax.random.PRNGKey(0))
    state, _ = trainer.run_iterations(state, 1)  # warm: first calls, page faults
    return trainer, state


def _time(fn, pids):
    c0, t0 = _cpu_seconds(pids), time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return dt, (_cpu_seconds(pids) - c0) / dt


def _mjx_steps_per_sec(env_id: str, num_envs: int, steps: int) -> float:
    import gymnasium as gym  # the env's own model and frame skip
    from mujoco import mjx

    env = gym.make(env_id).unwrapped
    env.reset(seed=0)
    model, data, skip = mjx.put_model(env.model), mjx.put_data(env.model, env.data), env.frame_skip
    nu = env.model.nu
    env.close()
    batch = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_envs, *x.shape)), data)

    def one(d, ctrl):
        d = d.replace(ctrl=ctrl)
        for _ in range(skip):
            d = mjx.step(model, d)
        return d

    @jax.jit
    def run(batch, key):
        def body(b, k):
            ctrl = jax.random.uniform(k, (num_envs, nu), minval=-0.5, maxval=0.5)
            return jax.vmap(one)(b, ctrl), None

        return jax.lax.scan(body, batch, jax.random.split(key, steps))[0]

    jax.block_until_ready(run(batch, jax.random.PRNGKey(0)))
    t0 = time.perf_counter()
    jax.block_until_ready(run(batch, jax.random.PRNGKey(1)))
    return steps * num_envs / (time.perf_counter() - t0)


def _policy_flops_per_iteration(trainer, state) -> float:
    """The JAX side of one iteration: the policy's acting on every micro-batch at every
    step, and the PPO update. The env workers' simulation (C MuJoCo) is not counted."""
    ts, i32, a = state.learner, jax.ShapeDtypeStruct((), jnp.int32), trainer.algorithm
    _, act_keys, learn_keys = a.iteration_keys(ts.key)
    act = roofline.program_flops(a.act, a.acting(ts), trainer._obs_struct(trainer.micro), act_keys, i32, i32, i32)
    env, record = trainer.steps(state, act_keys)  # one untimed rollout: the update's input
    learn = roofline.program_flops(a.learn, ts, Segment(env, record, state.obs), learn_keys, i32)
    return trainer.T * trainer.num_micro * act + learn


def _host_steps_per_sec(trainer, steps: int) -> float:
    pool = HostEnvPool(trainer.env.spec, trainer.env.num_envs, trainer.cfg.env.num_workers, seed=0)
    try:
        actions = np.random.default_rng(0).uniform(-0.5, 0.5, (steps, pool.num_envs, trainer.env.action_size))
        t0 = time.perf_counter()
        for a in actions:
            pool.step(a.astype(np.float32))
        return steps * pool.num_envs / (time.perf_counter() - t0)
    finally:
        pool.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--env", default="HalfCheetah-v5")
    p.add_argument("--num-envs", type=int, default=32)
    # One worker: on a 2-core CPU two workers already keep the cores busy in turn with the
    # policy, leaving nothing idle for the overlap (benchmarks/README.md has both).
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--rollout-length", type=int, default=32)
    p.add_argument("--hidden", type=int, default=256, help="policy width (3 layers)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mjx-steps", type=int, default=50)
    roofline.add_peak_argument(p)
    p.add_argument("--policy-cpus", type=int, nargs="*", default=[],
                   help="cores of this process (policy, update); pinned before JAX starts its threads")
    p.add_argument("--worker-cpus", type=int, nargs="*", default=[], help="cores of the env workers (env.worker_cpus)")
    args = p.parse_args()
    if args.policy_cpus:
        # Every thread that exists (importing JAX starts some); JAX's CPU client and its
        # thread pool start at the first computation, below, and inherit the pinning.
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), args.policy_cpus)

    modes = {"sequential": 1, "pipelined": 2}
    built = {name: _trainer(args, micro) for name, micro in modes.items()}
    per_iteration = built["sequential"][0].env_steps_per_iteration
    rounds = {name: {"iter": [], "rollout": [], "util": []} for name in modes}
    try:
        for r in range(args.repeats):
            for name, (trainer, state) in built.items():
                pids = [os.getpid()] + [w.proc.pid for w in trainer.pool.workers]
                a = trainer.algorithm

                def iterations():
                    _, sums = trainer.run_iterations(state, args.iterations)
                    jax.block_until_ready(sums)

                def rollouts():
                    for _ in range(args.iterations):
                        trainer.steps(state, a.iteration_keys(jax.random.PRNGKey(r))[1])

                dt, util = _time(iterations, pids)
                rounds[name]["iter"].append(args.iterations * per_iteration / dt)
                rounds[name]["util"].append(util)
                dt, _ = _time(rollouts, pids)
                rounds[name]["rollout"].append(args.iterations * per_iteration / dt)
                print(f"round {r} {name:10s} iterations {rounds[name]['iter'][-1]:8.0f} env-steps/s  "
                      f"rollouts {rounds[name]['rollout'][-1]:8.0f} env-steps/s  cpu {util:.2f} cores", flush=True)
        host = _host_steps_per_sec(built["sequential"][0], 200)
        flops = {name: _policy_flops_per_iteration(*built[name]) for name in modes}
    finally:
        for trainer, _ in built.values():
            trainer.close()
    mjx_rate = _mjx_steps_per_sec(args.env, args.num_envs, args.mjx_steps)
    out = {"env": args.env, "num_envs": args.num_envs, "workers": args.workers, "cpu_count": os.cpu_count(),
           "policy_hidden": [args.hidden] * 3, "policy_cpus": args.policy_cpus, "worker_cpus": args.worker_cpus}
    for name in modes:
        out[name] = {
            "env_steps_per_sec": round(statistics.median(rounds[name]["iter"]), 1),
            "rollout_env_steps_per_sec": round(statistics.median(rounds[name]["rollout"]), 1),
            "cpu_util": round(statistics.median(rounds[name]["util"]), 2),
        }
    out["host_env_steps_per_sec"] = round(host, 1)
    out["mjx_env_steps_per_sec"] = round(mjx_rate, 1)
    out["rollout_ratio"] = round(out["pipelined"]["rollout_env_steps_per_sec"] / out["sequential"]["rollout_env_steps_per_sec"], 3)
    out["ratio"] = round(out["pipelined"]["env_steps_per_sec"] / out["sequential"]["env_steps_per_sec"], 3)
    # The work is mostly the env workers' simulation: the FLOP/s are the policy's and the
    # update's alone (counted on their jaxprs), over the whole iteration's time.
    peak = roofline.peak_flops_per_s(args.peak_gflops)
    for name in modes:
        r = roofline.rate(flops[name], per_iteration / out[name]["env_steps_per_sec"], peak)  # s per iteration
        out[name]["policy_flops_per_iteration"] = r["flops"]
        out[name]["policy_flops_per_s"] = float(f"{r['flop_per_s']:.4g}")
        out[name]["policy_share_of_peak"] = float(f"{r['share_of_peak']:.4g}")
        print(roofline.line(f"{name} policy + update FLOP/s (simulation not counted)", r, peak))
    out["ours_flops_per_s"] = out["pipelined"]["policy_flops_per_s"]
    out["ours_share_of_peak"] = out["pipelined"]["policy_share_of_peak"]
    out["peak_flops_per_s"] = float(f"{peak:.4g}")
    warn_regressions("hostsim_modes", out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

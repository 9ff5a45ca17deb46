#!/usr/bin/env python
"""Greedy and sampled success of saved embodied runs, every run on the same episodes with
the same per-step keys.

A run's own evaluations score the greedy policy (for a flow VLA, the chain from zero
noise). PPO optimises the sampled one: the rollout's chains, drawn by
``rlinf_jax.restore(RUN).sample`` with the run's own sampling settings (method, noise,
temperature). This scores both over one batch of episodes (the env reset of
``PRNGKey(--seed)``, ``--episodes`` envs of the run's evaluation env), so a clone and the
PPO run started from it are compared on equal terms: the same episodes, and for the sampled
policy the same keys at every step.

    python benchmarks/flow_sampled_eval.py CLONE_RUN PPO_RUN --episodes 1024 --seed 777

The last line of stdout is one JSON object: per run its step, greedy and sampled success
and return, and the standard error of each success; for every run after the first, its
difference from the first on the same episodes (`paired_difference`).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import rlinf_jax as rj
from rlinf_jax.rollout.env_rollout import env_keys


def paired_difference(first, other) -> dict:
    """``other``'s success minus ``first``'s over the same episodes (0/1 per episode) and the
    standard error of that difference from the per-episode differences. Two policies
    played on the same episodes succeed and fail together on most of them, so this error
    is smaller than that of two independent evaluations (sqrt of the sum of their
    variances); ``gained`` / ``lost`` count the episodes only ``other`` / only ``first``
    succeeded in (McNemar's discordant pairs)."""
    a, b = np.asarray(first, np.float64), np.asarray(other, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(f"paired_difference needs two equal 1-D vectors of 2+ episodes, got {a.shape} and {b.shape}")
    d = b - a
    return {"difference": float(d.mean()), "se": float(d.std(ddof=1) / math.sqrt(d.size)),
            "gained": int(np.sum((b > 0) & (a == 0))), "lost": int(np.sum((a > 0) & (b == 0)))}


def score(run: str, episodes: int, seed: int) -> tuple[dict, dict]:
    """The greedy and the sampled policy of ``run`` over ``episodes`` envs reset by ``seed``:
    the JSON row, and each policy's success per episode (0/1) for `paired_difference`."""
    policy = rj.restore(run, [f"env.num_eval_envs={episodes}"])
    env, steps = policy.eval_env, policy.cfg.env.episode_length

    def episode(act, key):
        state = env.reset(jax.random.PRNGKey(seed))
        zeros = jnp.zeros_like(state.reward)

        def body(carry, step_key):
            state, ret, alive, success = carry
            state = env.step(state, act(state.obs, step_key))
            ret = ret + state.reward * alive
            success = jnp.maximum(success, (state.info["success"] > 0).astype(ret.dtype) * alive)
            return (state, ret, alive * (1.0 - state.done), success), None

        init = (state, zeros, zeros + 1.0, zeros)
        (_, ret, _, success), _ = jax.lax.scan(body, init, jax.random.split(key, steps))
        return jnp.mean(ret), success

    # The same key stream for every run: the sampled policies differ by their weights alone.
    keys = jax.random.PRNGKey(seed + 1)
    greedy = jax.jit(lambda k: episode(lambda obs, _: policy.act(obs), k))
    sampled = jax.jit(lambda k: episode(lambda obs, k: policy.sample(obs, env_keys(k, episodes, 0)), k))
    out, per_episode = {"run": run, "step": policy.step}, {}
    for name, fn in (("greedy", greedy), ("sampled", sampled)):
        start = time.perf_counter()
        ret, successes = fn(keys)
        per_episode[name] = np.asarray(successes)
        success = float(per_episode[name].mean())
        out[name] = {"success": success, "return": float(ret),
                     "success_se": math.sqrt(max(success * (1 - success), 0.0) / episodes),
                     "seconds": round(time.perf_counter() - start, 1)}
    return out, per_episode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="saved embodied runs (run folder or checkpoint)")
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=777)
    args = parser.parse_args()
    rows, first = [], None
    for run in args.runs:
        row, per_episode = score(run, args.episodes, args.seed)
        rows.append(row)
        g, s = row["greedy"], row["sampled"]
        line = (f"{run} (step {row['step']}): greedy {g['success']:.1%} (return {g['return']:.1f}), "
                f"sampled {s['success']:.1%} (return {s['return']:.1f})")
        if first is None:
            first = per_episode
        else:
            for name in ("greedy", "sampled"):
                row[name]["vs_first"] = paired_difference(first[name], per_episode[name])
            line += "; against the first run, same episodes: " + ", ".join(
                f"{name} {row[name]['vs_first']['difference']:+.1%} (se {row[name]['vs_first']['se']:.1%})"
                for name in ("greedy", "sampled"))
        print(line, flush=True)
    print(json.dumps({"episodes": args.episodes, "seed": args.seed, "runs": rows}))


if __name__ == "__main__":
    main()

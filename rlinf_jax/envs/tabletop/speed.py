"""Env throughput: `python -m rlinf_jax.envs.tabletop.speed --image-size 32 --num-envs 16`.

Times the jitted batched `step` (physics + rendering) after its first call, which is timed
separately as the compile. The machine may be shared, so the calls run in `--repeats`
rounds and the figures are the median round (the best round beside it). Prints one JSON
line: env-steps/s counts env-steps (one call is num_envs env-steps of chunk_length
sub-steps each) and sub-steps/s the control sub-steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.envs.tabletop.env import TabletopEnv
from rlinf_jax.errors import BadInput


def measure(num_envs: int, image_size: int, chunk_length: int, calls: int, repeats: int = 5) -> dict:
    env = TabletopEnv(num_envs=num_envs, image_size=image_size, chunk_length=chunk_length)
    step = jax.jit(env.step)
    state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    action = jax.random.uniform(jax.random.PRNGKey(1), (num_envs, chunk_length, 7), minval=-1, maxval=1)
    start = time.perf_counter()
    state = jax.block_until_ready(step(state, action))
    compile_s = time.perf_counter() - start
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            state = step(state, action)
        jax.block_until_ready(state)
        rounds.append((time.perf_counter() - start) / calls)
    per_call, best = float(np.median(rounds)), min(rounds)
    return {
        "num_envs": num_envs,
        "image_size": image_size,
        "chunk_length": chunk_length,
        "first_call_s": round(compile_s, 2),
        "ms_per_call": round(per_call * 1e3, 2),
        "best_ms_per_call": round(best * 1e3, 2),
        "env_steps_per_s": round(num_envs / per_call, 1),
        "substeps_per_s": round(num_envs * chunk_length / per_call, 1),
        "backend": jax.default_backend(),
        "mean_reward": float(jnp.mean(state.reward)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--chunk-length", type=int, default=1)
    p.add_argument("--calls", type=int, default=20, help="calls per round")
    p.add_argument("--repeats", type=int, default=5, help="rounds")
    args = p.parse_args(argv)
    try:
        print(json.dumps(measure(args.num_envs, args.image_size, args.chunk_length, args.calls, args.repeats)))
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

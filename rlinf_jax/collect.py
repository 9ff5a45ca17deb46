"""`python -m rlinf_jax.collect RUN --transitions N --out FILE.parquet`: a saved policy's
transitions as a dataset.

Restores the policy of a checkpoint (an embodied PPO run or an off-policy run: a run
folder, its checkpoints folder or one step folder), steps the run's own env batch with
it (``key=value`` overrides change env settings such as ``env.num_envs``) and writes
``N`` transitions to a Parquet file in the format RLPD's demonstrations and IQL's offline
data are read from (docs/offpolicy.md). ``--random-fraction F`` lets a fraction of the
envs act uniformly at random instead: a dataset with a known mix of good and bad episodes.
Prints one JSON line describing what was written.
"""

from __future__ import annotations

import argparse
import json
import sys


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m rlinf_jax.collect", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a run folder, its checkpoints folder, or one step folder")
    parser.add_argument("--transitions", type=int, required=True, help="how many transitions to write")
    parser.add_argument("--out", required=True, help="the new .parquet file to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the env resets and the policy's samples")
    parser.add_argument("--stochastic", action="store_true", help="sample from the policy (default: its mode)")
    parser.add_argument("--random-fraction", type=float, default=0.0,
                        help="share of the envs acting uniformly at random (default 0)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # Deferred until the arguments are parsed, so that `--help` answers before JAX loads.
    from rlinf_jax.errors import BadInput

    try:
        if args.transitions < 1:
            raise BadInput(f"--transitions={args.transitions} must be >= 1")
        if not 0.0 <= args.random_fraction <= 1.0:
            raise BadInput(f"--random-fraction={args.random_fraction} must be in [0, 1]")
        if not args.out.endswith(".parquet"):
            raise BadInput(f"--out {args.out}: transitions are written as Parquet; give a path ending in .parquet")
        from pathlib import Path

        if Path(args.out).exists():
            raise BadInput(f"--out {args.out} exists; choose a new file name")
        summary = _collect(args)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


def _collect(args) -> dict:
    import jax
    import numpy as np

    from rlinf_jax.errors import BadInput
    from rlinf_jax.replay import write_transitions
    from rlinf_jax.rollout.collect import collect
    from rlinf_jax.tasks.saved import restore_policy

    policy = restore_policy(args.path, args.overrides)
    env = policy.env
    num_envs = env.num_envs
    steps = -(-args.transitions // num_envs)
    num_random = round(args.random_fraction * num_envs)
    if policy.cfg.env.action_repeat != 1:
        raise BadInput("collecting from an env with env.action_repeat > 1 is not supported; set env.action_repeat=1")
    act = policy.sample if args.stochastic else (lambda obs, keys: policy.act(obs))
    batch, timeouts, episode, returns = collect(env, act, jax.random.PRNGKey(args.seed), steps, num_random)
    n = args.transitions
    batch = jax.tree.map(lambda x: x[:n], batch)
    meta = {
        "env": f"{policy.cfg.env.suite}/{policy.cfg.env.name}",
        "source": policy.checkpoint,
        "source_step": policy.step,
        "policy": "stochastic" if args.stochastic else "deterministic",
        "random_fraction": num_random / num_envs,
        "seed": args.seed,
        "finished_episodes": int(len(returns)),
        "mean_return": float(np.mean(returns)) if len(returns) else None,
    }
    path = write_transitions(args.out, batch, timeouts[:n], episode[:n], meta)
    return {"out": str(path), "transitions": n, **{k: v for k, v in meta.items() if k != "source"}}


if __name__ == "__main__":
    sys.exit(main())

"""`python -m rlinf_jax.collect RUN --transitions N --out FILE.parquet`: a saved policy's
transitions as a dataset.

Restores the policy of a checkpoint (an embodied PPO run or an off-policy run: a run
folder, its checkpoints folder or one step folder), steps the run's own env batch with
it (``key=value`` overrides change env settings such as ``env.num_envs``) and writes
``N`` transitions to a Parquet file in the format RLPD's demonstrations and IQL's offline
data are read from (docs/offpolicy.md). ``--random-fraction F`` lets a fraction of the
envs act uniformly at random instead: a dataset with a known mix of good and bad episodes.
Prints one JSON line describing what was written.

``--expert RECIPE`` in place of ``RUN`` makes the expert first: it trains the recipe's run
(``key=value`` overrides then configure that run; a run folder that already reached its last
step is used as it is, an unfinished one continued) and collects from it. One command makes
the dataset of the ``rlpd_brax`` and ``iql_brax`` recipes from a fresh checkout:
``python -m rlinf_jax.collect --expert ppo_brax --transitions 20000 --out runs/demos/inverted_pendulum.parquet``.
"""

from __future__ import annotations

import argparse
import json
import sys


def _parse_args(argv):
    # The docstring's first sentence spans two lines: all of it, not its first line.
    description = " ".join(__doc__.split("\n\n")[0].split())
    parser = argparse.ArgumentParser(prog="python -m rlinf_jax.collect", description=description)
    parser.add_argument("path", nargs="?", help="a run folder, its checkpoints folder, or one step folder")
    parser.add_argument("--expert", metavar="RECIPE",
                        help="instead of a run: train this recipe's run first (unless it already finished), then "
                        "collect from it; overrides configure that run")
    parser.add_argument("--transitions", type=int, required=True, help="how many transitions to write")
    parser.add_argument("--out", required=True, help="the new .parquet file to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the env resets and the policy's samples")
    parser.add_argument("--stochastic", action="store_true", help="sample from the policy (default: its mode)")
    parser.add_argument("--random-fraction", type=float, default=0.0,
                        help="share of the envs acting uniformly at random (default 0)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)
    if args.expert is not None and args.path is not None and "=" in args.path:
        # `--expert RECIPE key=value ...`: the first override lands in the optional run path.
        args.overrides, args.path = [args.path, *args.overrides], None
    return args


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # Deferred until the arguments are parsed, so that `--help` answers before JAX loads.
    from rlinf_jax.errors import BadInput

    try:
        if (args.path is None) == (args.expert is None):
            raise BadInput("give either a run to collect from (RUN) or a recipe to train it from (--expert RECIPE)")
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
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from rlinf_jax.crash import report_crash

        return report_crash(e)
    print(json.dumps(summary))
    return 0


def _collect(args) -> dict:
    import jax
    import numpy as np

    from rlinf_jax.errors import BadInput
    from rlinf_jax.replay import write_transitions
    from rlinf_jax.rollout.collect import collect
    from rlinf_jax.tasks.saved import restore_policy

    path, overrides = args.path, args.overrides
    if args.expert is not None:
        path, overrides = _expert_run(args.expert, args.overrides), []
    policy = restore_policy(path, overrides)
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


def _expert_run(recipe: str, overrides) -> str:
    """The run folder of ``recipe``'s run, trained now unless it already reached its last
    step (an unfinished one is continued): the expert ``--expert`` collects from."""
    from pathlib import Path

    from rich.console import Console

    from rlinf_jax.api import load_config, train
    from rlinf_jax.errors import BadInput
    from rlinf_jax.runtime import list_steps

    # The user's own runner.resume, if any, wins.
    cfg = load_config(recipe, ["runner.resume=auto", *overrides])
    if cfg.runner.task not in ("embodied", "offpolicy") or cfg.actor.model.kind != "mlp":
        raise BadInput(f"--expert {recipe} does not train a control policy on flat observations; name one "
                       "that does, such as ppo_brax")
    run_dir = Path(cfg.runner.output_dir) / cfg.runner.experiment_name
    steps = list_steps(run_dir / "checkpoints")
    if steps and steps[-1] >= cfg.runner.max_steps:
        print(f"expert: {run_dir} already trained to step {steps[-1]}", file=sys.stderr)
    else:
        # stdout stays the one JSON line: the training's bar and summary go to stderr.
        print(f"expert: training {recipe} in {run_dir}", file=sys.stderr)
        train(cfg, console=Console(stderr=True))
    return str(run_dir)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m rlinf_jax.train [--config-name NAME] [key=value ...]`: config -> flow -> run.

``runner.task`` picks the task (`rlinf_jax.tasks.registry`): ``embodied`` (PPO / GRPO on a
batched env, MLP, VLA or pi0 policy), ``sft`` (supervised fine-tuning of a language model,
or with ``actor.model.kind=vla`` behaviour cloning of a VLA on expert demonstrations) or
``reasoning`` (RL of a language model on verifiable rewards).
"""

from __future__ import annotations

import argparse
import sys

from rlinf_jax.api import prepare_jax


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m rlinf_jax.train",
        description="Train a policy with reinforcement learning (or a language model with SFT). Overrides are "
        "dotted key=value pairs, e.g. runner.max_steps=50 env.name=ant.",
    )
    parser.add_argument("--config-name", "-cn", default="ppo_brax", help="recipe in configs/ (default: ppo_brax)")
    parser.add_argument("--list-recipes", action="store_true", help="print the available recipes and exit")
    parser.add_argument("--list-envs", action="store_true", help="print the available envs and exit")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_intermixed_args(argv)


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # Deferred until the arguments are parsed, so that `--help` answers before JAX loads.
    from rich.console import Console

    from rlinf_jax.errors import BadInput

    console = Console(stderr=False)
    run_dir = None  # where a crash report goes, once the config names it
    try:
        # The listings answer before JAX loads (the env names are read from the suites'
        # files, not imported: Brax and MJX take seconds).
        if args.list_recipes:
            from rlinf_jax.config import list_recipes

            print("\n".join(list_recipes()))
            return 0
        if args.list_envs:
            from rlinf_jax.envs.names import list_envs

            for suite, names in list_envs().items():
                print(f"{suite}: {', '.join(names)}")
            return 0
        # Before the tasks' imports start JAX's backend: XLA reads its flags then.
        prepare_jax(args.config_name, args.overrides)
        from rlinf_jax.flow.host_loop import TrainingDiverged
        from rlinf_jax.tasks.registry import load_run_config, task_of

        cfg = load_run_config(args.config_name, args.overrides, warn=lambda m: print(f"warning: {m}", file=sys.stderr))
        run_dir = f"{cfg.runner.output_dir}/{cfg.runner.experiment_name}"
        task = task_of(cfg)
        try:
            summary = task.run(cfg, console=console)
        except TrainingDiverged as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = f": continue from the last checkpoint with runner.resume=auto (run dir {run_dir})" if run_dir else ""
        print(f"interrupted{hint}", file=sys.stderr)
        return 130
    except Exception as e:
        from rlinf_jax.crash import report_crash

        return report_crash(e, run_dir)
    console.print(summary.text(), soft_wrap=True)  # a long line stays one line
    return 0

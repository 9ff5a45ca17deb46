"""`python -m rlinf_jax.train [--config-name NAME] [key=value ...]`: config -> flow -> run.

``runner.task`` picks the flow: ``embodied`` (PPO / GRPO on a batched env, MLP or VLA
policy), ``sft`` (supervised fine-tuning of a language model, or with
``actor.model.kind=vla`` behaviour cloning of a VLA on expert demonstrations) or
``reasoning`` (RL of a language model on verifiable rewards).
"""

from __future__ import annotations

import argparse
import sys


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


def _print_summary(summary, console):
    ret = "n/a" if summary.eval_return is None else f"{summary.eval_return:.1f}"
    resumed = "" if summary.resumed_from is None else f" (resumed from step {summary.resumed_from})"
    console.print(
        f"[bold]done[/bold]: {summary.steps} iterations, {summary.env_steps:,} env steps{resumed}\n"
        f"  final eval return  {ret}\n"
        f"  env-steps/s        {summary.env_steps_per_sec:,.0f}\n"
        f"  compile time       {summary.compile_sec:.1f} s\n"
        f"  wall time          {summary.wall_sec:.1f} s\n"
        f"  saved in           {summary.run_dir}"
    )


def _print_lm_summary(summary, console):
    def acc(v):
        return "n/a" if v is None else f"{v:.3f}"

    resumed = "" if summary.resumed_from is None else f" (resumed from step {summary.resumed_from})"
    warm = "" if summary.warm_start is None else f"\n  warm start         {summary.warm_start}"
    console.print(
        f"[bold]done[/bold]: {summary.steps} {summary.task} steps{resumed}\n"
        f"  eval {summary.metric:<13} {acc(summary.initial_accuracy)} at step 0 -> {acc(summary.eval_accuracy)}\n"
        f"  samples/s          {summary.samples_per_sec:,.1f}\n"
        f"  wall time          {summary.wall_sec:.1f} s{warm}\n"
        f"  saved in           {summary.run_dir}"
    )


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    # Heavy imports after argument parsing so `--help` is instant.
    from rich.console import Console

    from rlinf_jax.errors import BadInput

    console = Console(stderr=False)
    try:
        from rlinf_jax.config import list_recipes, load_config
        from rlinf_jax.envs import list_envs

        if args.list_recipes:
            print("\n".join(list_recipes()))
            return 0
        if args.list_envs:
            for suite, names in list_envs().items():
                print(f"{suite}: {', '.join(names)}")
            return 0
        cfg = load_config(args.config_name, args.overrides)

        from rlinf_jax.flow.embodied_runner import TrainingDiverged

        if cfg.runner.task == "embodied":
            from rlinf_jax.flow.embodied_runner import run
        elif cfg.runner.task == "sft" and cfg.actor.model.kind == "vla":
            from rlinf_jax.flow.vla_sft import run  # behaviour cloning of a VLA on expert demos
        else:
            from rlinf_jax.flow.reasoning_runner import run
        try:
            summary = run(cfg, console=console)
        except TrainingDiverged as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(
                f"interrupted: continue from the last checkpoint with runner.resume=auto "
                f"(run dir {cfg.runner.output_dir}/{cfg.runner.experiment_name})",
                file=sys.stderr,
            )
            return 130
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cfg.runner.task == "embodied":
        _print_summary(summary, console)
    else:
        _print_lm_summary(summary, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())

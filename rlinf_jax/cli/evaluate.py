"""`python -m rlinf_jax.evaluate`: score a saved policy.

Embodied: ``python -m rlinf_jax.evaluate RUN_OR_CHECKPOINT [key=value ...]`` loads the run's
resolved ``config.yaml`` (overrides may change evaluation settings such as
``env.num_eval_envs`` or ``env.episode_length``), restores the checkpoint (the latest one
for a run or checkpoints folder), runs the deterministic policy for one episode in every
eval env and prints one JSON object. By default the episodes are those of the run's own
evaluation at the checkpoint's step, so the numbers are the ones the run logged there;
``--seed N`` draws other episodes (the object's ``protocol`` says which). On the VLA
tabletop the object holds ``eval/success/<split>`` for every split (success reached at
least once in the episode), and ``--strip FILE.png`` saves an image strip of episodes.

Language models: ``python -m rlinf_jax.evaluate --checkpoint DIR [--data PATH] [--k K]
[key=value ...]`` answers every prompt of a JSONL / JSON / Parquet file (default: the run's
held-out split) ``--n`` times and reports pass@1 and pass@k (greedy with one sample, else
sampled at ``--temperature``). ``DIR`` is an sft / reasoning run folder or checkpoint, or a
Hugging Face / converted model directory. A progress bar runs on stderr; the full report,
every response included, goes to ``--out`` (default ``<run folder>/eval/<data>_step<N>.json``)
and the summary is the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlinf_jax.api import prepare_jax
from rlinf_jax.errors import BadInput


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m rlinf_jax.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", help="embodied: a run folder, its checkpoints folder, or one step folder")
    parser.add_argument(
        "--seed", type=int, default=None,
        help="embodied: draw other episodes than the run's own evaluation at that step (the default); "
        "language models: the samples' seed (default 0)",
    )
    parser.add_argument(
        "--strip", metavar="PNG", help="embodied envs with images: also save an image strip of episodes (rows) x steps"
    )
    parser.add_argument("--strip-episodes", type=int, default=4, help="episodes in the image strip (default 4)")
    lm = parser.add_argument_group("language models")
    lm.add_argument("--checkpoint", help="an sft / reasoning run or checkpoint, or a Hugging Face model directory")
    lm.add_argument("--data", help="prompts to answer: .jsonl / .json / .parquet (default: the run's held-out split)")
    lm.add_argument("--k", type=int, nargs="+", default=None, help="report pass@k for these k (default: 1 and --n)")
    lm.add_argument("--n", type=int, default=None, help="samples per prompt (default: the largest k)")
    lm.add_argument("--temperature", type=float, default=None,
                    help="sampling temperature (default: greedy for one sample, 1.0 for more)")
    lm.add_argument("--out", help="where to write the JSON report")
    lm.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    # Intermixed: `PATH --seed 3 key=value` as well as `PATH key=value --seed 3`.
    args = parser.parse_intermixed_args(argv)
    if args.checkpoint is not None and args.path is not None and "=" in args.path:
        # `--checkpoint RUN key=value`: the first override lands in the optional path.
        args.overrides, args.path = [args.path, *args.overrides], None
    return args


def _step_folders(folder: Path) -> bool:
    """Whether ``folder`` holds a folder named by a step (True when it cannot be read:
    then the checkpoint code says why)."""
    try:
        return folder.is_dir() and any(d.name.isdigit() and d.is_dir() for d in folder.iterdir())
    except OSError:
        return True


def check_path(path: str | None, model: bool) -> None:
    """The mistakes in a path that need no JAX to see: it is not there, or (a run's path)
    it is a folder with no step folder in it or in its ``checkpoints/``. Anything subtler
    is for the checkpoint code to say."""
    if path is None:
        return
    given, path = path, Path(path)
    what = "--checkpoint" if model else "path"
    if not path.exists():
        raise BadInput(f"{what}={given!r}: no such path; give a run folder or a checkpoint path")
    if model or (path.name.isdigit() and path.is_dir()):
        return
    if not any(_step_folders(folder) for folder in (path, path / "checkpoints")):
        raise BadInput(
            f"{what}={given!r} holds no finished checkpoint; point it at a step folder "
            "(.../checkpoints/<step>), a checkpoints folder, or a run folder"
        )


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        # A path that is not there is answered before JAX loads (seconds).
        check_path(args.checkpoint if args.checkpoint is not None else args.path, args.checkpoint is not None)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # Before the tasks' imports start JAX's backend (the saved run's own setting is not
    # known yet: the default, or runner.xla_cpu_flags=... among the overrides).
    prepare_jax(None, args.overrides)
    from rlinf_jax.tasks.reasoning.evaluate import evaluate_lm
    from rlinf_jax.tasks.saved import evaluate_run

    try:
        if args.checkpoint is not None:
            if args.path is not None:
                raise BadInput("give either a run path (embodied) or --checkpoint (language models), not both")
            result = evaluate_lm(
                args.checkpoint, args.data, args.overrides, seed=args.seed or 0, ks=args.k, n=args.n,
                temperature=args.temperature, out=args.out, progress=not args.no_progress,
            )
        elif args.path is None:
            raise BadInput("nothing to evaluate: give a run folder (embodied) or --checkpoint DIR (language models)")
        else:
            result = evaluate_run(args.path, args.overrides, args.seed, args.strip, args.strip_episodes)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from rlinf_jax.crash import report_crash

        return report_crash(e, _run_folder(args.checkpoint if args.checkpoint is not None else args.path))
    print(json.dumps(result))
    return 0


def _run_folder(path: str | None) -> Path | None:
    """The run folder a checkpoint path belongs to (the one holding ``config.yaml``): where a
    crash report goes. None for a model directory or anything else."""
    if path is None:
        return None
    here = Path(path).absolute()
    for folder in (here, *list(here.parents)[:2]):  # the run, its checkpoints/ or one step
        if (folder / "config.yaml").is_file():
            return folder
    return None

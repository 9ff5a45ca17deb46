"""`python -m rlinf_jax.evaluate`: score a saved policy.

Embodied: ``python -m rlinf_jax.evaluate RUN_OR_CHECKPOINT [key=value ...]`` loads the run's
resolved ``config.yaml`` (overrides may change evaluation settings such as
``env.num_eval_envs`` or ``env.episode_length``), restores the checkpoint (the latest one
for a run or checkpoints folder), runs the deterministic policy for one episode in every
eval env and prints one JSON object. Same checkpoint, same seed: same numbers. On the VLA
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


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m rlinf_jax.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", help="embodied: a run folder, its checkpoints folder, or one step folder")
    parser.add_argument("--seed", type=int, default=0, help="seed of the eval episodes' initial states / the samples")
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
    return parser.parse_intermixed_args(argv)


def evaluate(path, overrides=(), seed: int = 0, strip=None, strip_episodes: int = 4) -> dict:
    import jax

    from rlinf_jax.config import load_config_file
    from rlinf_jax.config.schema import FlowConfig
    from rlinf_jax.errors import BadInput
    from rlinf_jax.flow.embodied_runner import build_trainer
    from rlinf_jax.runtime import find_checkpoint, restore_checkpoint

    point = find_checkpoint(path, "path")
    config_path = Path(point.directory).parent / "config.yaml"
    if not config_path.is_file():
        raise BadInput(f"{config_path} is missing: evaluate needs the run folder's resolved config next to checkpoints/")
    cfg = load_config_file(config_path, overrides)
    # Evaluation is one jitted loop whatever layout trained the policy: run it collocated.
    cfg.cluster.component_placement = "collocated"
    cfg.flow = FlowConfig()
    cfg.sft.warm_start_steps = 0  # the checkpoint holds the weights; no behaviour cloning to redo
    if strip is not None and Path(strip).exists():
        raise BadInput(f"--strip {strip} exists; choose a new file name")
    trainer = build_trainer(cfg)
    state, _ = restore_checkpoint(point, trainer.init(), keep=cfg.runner.keep_checkpoints)
    metrics = trainer.evaluate(state.params, state.obs_stats, jax.random.PRNGKey(seed))
    extra = {}
    if strip is not None:
        extra["strip"] = str(_save_strip(trainer, state, cfg, seed, strip, strip_episodes))
    return {
        "checkpoint": str(point.path),
        "step": int(state.step),
        "env": f"{cfg.env.suite}/{cfg.env.name}",
        "episodes": cfg.env.num_eval_envs,
        "seed": seed,
        **{k: float(v) for k, v in metrics.items()},
        **extra,
    }


def _save_strip(trainer, state, cfg, seed: int, path, episodes: int):
    """The first ``episodes`` eval episodes, one frame per policy step, as one PNG."""
    import jax
    import numpy as np

    from rlinf_jax.errors import BadInput
    from rlinf_jax.runtime.media import image_strip, write_png

    obs = jax.eval_shape(trainer.eval_env.reset, jax.random.PRNGKey(0)).obs
    if not isinstance(obs, dict) or "image" not in obs:
        raise BadInput(f"--strip needs an env with image observations; {cfg.env.suite}/{cfg.env.name} has none")
    substeps = max(1, trainer.substeps)
    steps = -(-cfg.env.episode_length // substeps)
    frames = trainer.episode_frames(state.params, state.obs_stats, jax.random.PRNGKey(seed), steps)
    return write_png(path, image_strip(np.asarray(frames)[:, :episodes]))


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    from rlinf_jax.errors import BadInput

    try:
        if args.checkpoint is not None:
            if args.path is not None:
                raise BadInput("give either a run path (embodied) or --checkpoint (language models), not both")
            from rlinf_jax.flow.reasoning_evaluate import evaluate_lm

            result = evaluate_lm(
                args.checkpoint, args.data, args.overrides, seed=args.seed, ks=args.k, n=args.n,
                temperature=args.temperature, out=args.out, progress=not args.no_progress,
            )
        elif args.path is None:
            raise BadInput("nothing to evaluate: give a run folder (embodied) or --checkpoint DIR (language models)")
        else:
            result = evaluate(args.path, args.overrides, args.seed, args.strip, args.strip_episodes)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

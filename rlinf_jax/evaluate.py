"""`python -m rlinf_jax.evaluate RUN_OR_CHECKPOINT [key=value ...]`: score a saved policy.

Loads the run's resolved ``config.yaml`` (overrides may change evaluation settings such as
``env.num_eval_envs`` or ``env.episode_length``), restores the checkpoint (the latest one
for a run or checkpoints folder), runs the deterministic policy for one episode in every
eval env and prints one JSON object. Same checkpoint, same seed: same numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m rlinf_jax.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a run folder, its checkpoints folder, or one step folder")
    parser.add_argument("--seed", type=int, default=0, help="seed of the eval episodes' initial states")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    # Intermixed: `PATH --seed 3 key=value` as well as `PATH key=value --seed 3`.
    return parser.parse_intermixed_args(argv)


def evaluate(path, overrides=(), seed: int = 0) -> dict:
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
    trainer = build_trainer(cfg)
    state, _ = restore_checkpoint(point, trainer.init(), keep=cfg.runner.keep_checkpoints)
    metrics = trainer.evaluate(state.params, state.obs_stats, jax.random.PRNGKey(seed))
    return {
        "checkpoint": str(point.path),
        "step": int(state.step),
        "env": f"{cfg.env.suite}/{cfg.env.name}",
        "episodes": cfg.env.num_eval_envs,
        "seed": seed,
        **{k: float(v) for k, v in metrics.items()},
    }


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    from rlinf_jax.errors import BadInput

    try:
        result = evaluate(args.path, args.overrides, args.seed)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Env names, config validation and the standard wrapper stack.

`make_env` builds, innermost first:
    base env -> ActionRepeat -> TimeLimit -> VmapEnv -> EpisodeStats -> AutoReset

``episode_length`` counts steps of the base env, as in Brax and Playground: with
``action_repeat=k`` the agent sees ``ceil(episode_length / k)`` steps per episode, and
``info["steps"]`` / ``info["episode_length"]`` count those agent steps.

The ``tabletop`` suite (the VLA benchmark, `envs.tabletop`) is batched itself and ends its
episodes at ``episode_length`` control sub-steps inside its chunked step, so its stack is
    TabletopEnv -> EpisodeStats -> AutoReset
with ``env.name`` naming the split (train | vision | semantic | execution). Its
``chunk_length``, ``image_size`` and ``group_size`` are read from the env config where the
schema has them (defaults 1, 32, 1).
"""

from __future__ import annotations

import difflib
import math
import numbers

from rlinf_jax.config.schema import EnvConfig
from rlinf_jax.envs.base import Env
from rlinf_jax.envs.brax_env import BRAX_BACKENDS, BraxEnv
from rlinf_jax.envs.playground_env import PLAYGROUND_BACKENDS, PlaygroundEnv, playground_env_names
from rlinf_jax.envs.tabletop import SPLITS, TabletopEnv
from rlinf_jax.envs.wrappers import ActionRepeat, AutoReset, EpisodeStats, TimeLimit, VmapEnv
from rlinf_jax.errors import BadInput

TABLETOP_BACKENDS = ("mjx",)
BACKENDS = {"brax": BRAX_BACKENDS, "playground": PLAYGROUND_BACKENDS, "tabletop": TABLETOP_BACKENDS}


def _brax_env_names() -> list[str]:
    from brax import envs as brax_envs

    # Brax has no public listing; `_envs` is the registry `get_environment` reads.
    return sorted(brax_envs._envs)


def _tabletop_env_names() -> list[str]:
    return list(SPLITS)


# Each suite's names on their own: validating one suite need not import the others.
_SUITE_NAMES = {"brax": _brax_env_names, "playground": playground_env_names, "tabletop": _tabletop_env_names}


def registered_envs() -> dict[str, list[str]]:
    """Suite -> sorted env names, from the imported registries (what `make_env` checks
    names against; `envs.names.list_envs` lists them without the imports)."""
    return {suite: names() for suite, names in _SUITE_NAMES.items()}


def _check_positive(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise BadInput(f"env.{what} must be an integer >= 1, got {value!r}")
    return int(value)


def _validate(cfg: EnvConfig) -> None:
    if cfg.suite not in BACKENDS:
        raise BadInput(f"unknown env suite {cfg.suite!r}; choose one of {', '.join(BACKENDS)}")
    names = _SUITE_NAMES[cfg.suite]()
    if cfg.name not in names:
        close = difflib.get_close_matches(str(cfg.name), names, n=1, cutoff=0.0)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise BadInput(f"unknown {cfg.suite} env {cfg.name!r}; {hint}valid: {', '.join(names)}")
    if cfg.backend not in BACKENDS[cfg.suite]:
        raise BadInput(
            f"unknown {cfg.suite} backend {cfg.backend!r}; choose one of {', '.join(BACKENDS[cfg.suite])}"
        )
    for field in ("num_envs", "episode_length", "action_repeat", "num_eval_envs"):
        _check_positive(getattr(cfg, field), field)
    if cfg.suite == "tabletop" and cfg.action_repeat != 1:
        raise BadInput("env.action_repeat must be 1 for tabletop; it executes action chunks (chunk_length)")
    if cfg.reset_mode not in AutoReset.MODES:
        raise BadInput(f"unknown env.reset_mode {cfg.reset_mode!r}; choose one of {', '.join(AutoReset.MODES)}")


def _make_base(cfg: EnvConfig) -> Env:
    if cfg.suite == "brax":
        return BraxEnv(cfg.name, backend=cfg.backend)
    return PlaygroundEnv(cfg.name, backend=cfg.backend)


def _make_tabletop(cfg: EnvConfig, num_envs: int, grouped: bool) -> Env:
    # Groups of envs sharing a reset are a training device (GRPO); evaluation envs each
    # run their own episode.
    return TabletopEnv(
        split=cfg.name,
        num_envs=num_envs,
        max_steps=cfg.episode_length,
        chunk_length=getattr(cfg, "chunk_length", 1),
        image_size=getattr(cfg, "image_size", 32),
        group_size=getattr(cfg, "group_size", 1) if grouped else 1,
        layout=getattr(cfg, "layout", "random"),
        terminate_on_success=getattr(cfg, "terminate_on_success", False),
    )


def _make_stack(cfg: EnvConfig, num_envs: int, auto_reset: bool) -> Env:
    if cfg.suite == "tabletop":
        env = EpisodeStats(_make_tabletop(cfg, num_envs, grouped=auto_reset))
        return AutoReset(env, cfg.reset_mode) if auto_reset else env
    env = _make_base(cfg)
    if cfg.action_repeat > 1:
        env = ActionRepeat(env, cfg.action_repeat)
    env = TimeLimit(env, math.ceil(cfg.episode_length / cfg.action_repeat))
    env = EpisodeStats(VmapEnv(env, num_envs))
    return AutoReset(env, cfg.reset_mode) if auto_reset else env


def make_env(env_cfg: EnvConfig, num_envs: int | None = None, auto_reset: bool = True) -> Env:
    """The batched training env (`env_cfg.num_envs` envs unless `num_envs` is given)."""
    _validate(env_cfg)
    n = env_cfg.num_envs if num_envs is None else _check_positive(num_envs, "num_envs")
    return _make_stack(env_cfg, n, auto_reset)


def make_eval_env(env_cfg: EnvConfig) -> Env:
    """`num_eval_envs` envs with TimeLimit and EpisodeStats but no auto-reset.

    After its first ``done`` an eval env keeps stepping from where it ended (a fallen
    pendulum stays done), so read each env's statistics at its first ``done``.
    """
    _validate(env_cfg)
    return _make_stack(env_cfg, env_cfg.num_eval_envs, auto_reset=False)

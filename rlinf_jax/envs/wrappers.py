"""Pure functional env wrappers: each takes an Env and returns an Env.

All bookkeeping lives in ``EnvState.info``. Every wrapper strips its own keys before
calling the env it wraps and puts them back afterwards, so an inner env (and `VmapEnv`'s
`vmap`) only ever sees the keys that belong to it. The keys are created at reset and never
change afterwards, so the state pytree has a fixed structure across steps (`lax.scan`).

Convention used by `AutoReset`: info keys starting with ``episode_`` describe the episode
that just ended and survive the reset; every other key is per-episode state (step
counters, running sums, ...) and is restored from the reset state when an env finishes.

The wrappers are shape-generic: they work on an unbatched env (scalar ``done``) and on a
batched one (``done`` of shape ``[B]``, broadcast against leaves with trailing dims).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rlinf_jax.envs.base import Env, EnvState

# Info keys reporting on the finished episode; AutoReset leaves them as the step set them.
EPISODE_OUTPUT_PREFIX = "episode_"


def select(mask: jax.Array, on_true, on_false):
    """Per-env `where` over two pytrees of equal structure; `mask` is [] or [B]."""
    mask = jnp.asarray(mask, bool)

    def pick(x, y):
        x, y = jnp.asarray(x), jnp.asarray(y)
        if x.ndim < mask.ndim:
            raise ValueError(f"leaf of shape {x.shape} has no env axis for a mask of shape {mask.shape}")
        m = mask.reshape(mask.shape + (1,) * (x.ndim - mask.ndim))
        return jnp.where(m, x, y)

    return jax.tree_util.tree_map(pick, on_true, on_false)


def _without(info: dict, keys) -> dict:
    return {k: v for k, v in info.items() if k not in keys}


class Wrapper:
    """Forwards everything to the wrapped env; subclasses override reset/step."""

    def __init__(self, env: Env):
        self.env = env
        self.observation_size = env.observation_size
        self.action_size = env.action_size
        self.num_envs = env.num_envs

    def reset(self, key: jax.Array) -> EnvState:
        return self.env.reset(key)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        return self.env.step(state, action)

    @property
    def unwrapped(self):
        return getattr(self.env, "unwrapped", self.env)

    @property
    def has_success(self) -> bool | None:
        """Whether states carry ``info["success"]`` (None: the env does not say)."""
        return getattr(self.env, "has_success", None)


class ActionRepeat(Wrapper):
    """Applies each action `n` times and sums the rewards.

    Once a sub-step ends the episode, the later sub-steps are computed (vmap needs the
    same program for every env) but discarded, so neither reward nor done changes.
    """

    def __init__(self, env: Env, n: int):
        if n < 1:
            raise ValueError(f"action repeat must be >= 1, got {n}")
        super().__init__(env)
        self.n = int(n)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        # The first sub-step always runs: an env stepped past its end (no auto-reset) must
        # still move on, exactly as it would without this wrapper.
        first = self.env.step(state, action)
        if self.n == 1:
            return first

        def sub_step(carry, _):
            s, total = carry
            nxt = self.env.step(s, action)
            ended = s.done > 0
            total = total + jnp.where(ended, 0.0, nxt.reward)
            return (select(ended, s, nxt), total), None

        (last, total), _ = jax.lax.scan(sub_step, (first, first.reward), None, length=self.n - 1)
        return last.replace(reward=total)


class TimeLimit(Wrapper):
    """Ends an episode after `episode_length` steps of the wrapped env.

    ``info["steps"]`` counts the steps of this episode. A time-limit end sets
    ``truncated=1`` and ``done=1``; if the env terminated on that same step it is a
    termination (``truncated`` stays as the env set it).
    """

    KEYS = ("steps",)

    def __init__(self, env: Env, episode_length: int):
        if episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {episode_length}")
        super().__init__(env)
        self.episode_length = int(episode_length)

    def reset(self, key: jax.Array) -> EnvState:
        s = self.env.reset(key)
        return s.replace(info={**s.info, "steps": jnp.zeros(s.done.shape, jnp.int32)})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        s = self.env.step(state.replace(info=_without(state.info, self.KEYS)), action)
        steps = state.info["steps"] + 1
        hit = (steps >= self.episode_length).astype(jnp.float32)
        terminated = s.done > 0
        return s.replace(
            done=jnp.maximum(s.done, hit),
            truncated=jnp.where(terminated, s.truncated, hit),
            info={**s.info, "steps": steps},
        )


class VmapEnv(Wrapper):
    """Batches an unbatched env: every state leaf gets a leading [num_envs] axis."""

    def __init__(self, env: Env, num_envs: int):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        super().__init__(env)
        self.num_envs = int(num_envs)

    def reset(self, key: jax.Array) -> EnvState:
        return jax.vmap(self.env.reset)(jax.random.split(key, self.num_envs))

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        return jax.vmap(self.env.step)(state, action)


class EpisodeStats(Wrapper):
    """Per-env return and length (in steps of the wrapped env) of finished episodes.

    At a step with ``done=1``, ``info["episode_return"]`` / ``info["episode_length"]`` hold
    that episode's totals; elsewhere they keep the previous finished episode's (0 before
    the first), so read them only where done. If the env exposes ``info["success"]``,
    ``info["episode_success"]`` is 1 when success was reached at any step of the episode.
    """

    def _keys(self, info) -> tuple[str, ...]:
        keys = ("episode_return", "episode_length", "running_return", "running_length")
        if "success" in info:
            keys += ("episode_success", "running_success")
        return keys

    def reset(self, key: jax.Array) -> EnvState:
        s = self.env.reset(key)
        zf, zi = jnp.zeros(s.done.shape, jnp.float32), jnp.zeros(s.done.shape, jnp.int32)
        info = {**s.info, "episode_return": zf, "episode_length": zi, "running_return": zf, "running_length": zi}
        if "success" in s.info:
            info.update(episode_success=zf, running_success=(s.info["success"] > 0).astype(jnp.float32))
        return s.replace(info=info)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        old = state.info
        s = self.env.step(state.replace(info=_without(old, self._keys(old))), action)
        done = s.done > 0
        ret = old["running_return"] + s.reward
        length = old["running_length"] + 1
        info = {
            **s.info,
            "episode_return": jnp.where(done, ret, old["episode_return"]),
            "episode_length": jnp.where(done, length, old["episode_length"]),
            # Accumulators restart here so that the next step starts a new episode even
            # when nothing resets the env's info (evaluation without auto-reset).
            "running_return": jnp.where(done, 0.0, ret),
            "running_length": jnp.where(done, 0, length),
        }
        if "success" in old:
            succ = jnp.maximum(old["running_success"], (s.info["success"] > 0).astype(jnp.float32))
            info["episode_success"] = jnp.where(done, succ, old["episode_success"])
            info["running_success"] = jnp.where(done, 0.0, succ)
        return s.replace(info=info)


class AutoReset(Wrapper):
    """Where an episode ended, swaps in an initial state so the batch never stops.

    The step's reward/done/truncated stay those of the finishing step; ``obs`` becomes the
    next episode's first observation and ``info["final_obs"]`` holds the observation the
    episode ended on (equal to ``obs`` where not done). What is reset: ``obs``, ``sim`` and
    every info key of the wrapped env except the ``episode_*`` outputs.

    mode="cached": the initial state drawn at `reset` is kept in ``info["first_state"]``
    and reused (Brax's way: no reset cost per step, each env replays its first state).
    mode="fresh": a new initial state is drawn from a key carried in
    ``info["reset_key"]`` (split every step); the reset runs only on steps where some
    env finished.
    """

    MODES = ("cached", "fresh")

    def __init__(self, env: Env, mode: str = "cached"):
        if mode not in self.MODES:
            raise ValueError(f"reset mode must be one of {self.MODES}, got {mode!r}")
        super().__init__(env)
        self.mode = mode
        self._own = ("final_obs", "first_state") if mode == "cached" else ("final_obs", "reset_key")

    @staticmethod
    def _restorable(s: EnvState) -> dict:
        info = {k: v for k, v in s.info.items() if not k.startswith(EPISODE_OUTPUT_PREFIX)}
        return {"obs": s.obs, "sim": s.sim, "info": info}

    def reset(self, key: jax.Array) -> EnvState:
        if self.mode == "fresh":
            key, sub = jax.random.split(key)
            s = self.env.reset(sub)
            extra = {"reset_key": key}
        else:
            s = self.env.reset(key)
            extra = {"first_state": self._restorable(s)}
        return s.replace(info={**s.info, "final_obs": s.obs, **extra})

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        s = self.env.step(state.replace(info=_without(state.info, self._own)), action)
        done = s.done > 0
        current = self._restorable(s)
        own = {k: state.info[k] for k in self._own if k != "final_obs"}
        if self.mode == "cached":
            initial = state.info["first_state"]
        else:
            key, sub = jax.random.split(state.info["reset_key"])
            own["reset_key"] = key
            initial = jax.lax.cond(
                jnp.any(done), lambda: self._restorable(self.env.reset(sub)), lambda: current
            )
        new = select(done, initial, current)
        return s.replace(obs=new["obs"], sim=new["sim"], info={**s.info, **new["info"], "final_obs": s.obs, **own})

"""The functional, batched environment interface.

An environment is a pair of pure functions over an immutable state pytree:

    state = env.reset(key)            # batched: every leaf has a leading [num_envs] axis
    state = env.step(state, action)   # action: [num_envs, action_size]

Both are jittable and carry no Python-side state, so a rollout is a `lax.scan` over
`env.step` and a whole training iteration can be one `jax.jit`.

Semantics of one step's outputs (all `[num_envs]`, float32):
- ``reward``: reward received for the transition just taken.
- ``done``: 1 when the episode ended after this step, for any reason.
- ``truncated``: 1 when that end was a time limit (bootstrap from the final observation).
- with auto-reset, ``obs`` is already the first observation of the next episode and
  ``info["final_obs"]`` holds the observation the episode ended on.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import struct

from rlinf_jax.array_types import Array, Float, Observation


@struct.dataclass
class EnvState:
    obs: Observation  # [*batch, obs]: [envs, obs] (seeds side by side: [seeds, envs, obs])
    reward: Float[Array, "*batch"]
    done: Float[Array, "*batch"]  # 1.0 where the episode ended at this step
    truncated: Float[Array, "*batch"]  # 1.0 where it ended by the time limit
    # Wrapper bookkeeping (step counters, episode statistics, final_obs, ...). Keys are
    # fixed at reset so the pytree structure never changes across steps.
    info: dict[str, Any]
    # The simulator's own state (a Brax / MJX pipeline state); opaque to the trainer.
    sim: Any


class Env(Protocol):
    """What the trainer relies on. Wrappers take an Env and return an Env."""

    observation_size: int
    action_size: int
    num_envs: int

    def reset(self, key: jax.Array) -> EnvState: ...

    def step(self, state: EnvState, action: jax.Array) -> EnvState: ...


def reports_success(env: Env) -> bool:
    """Whether ``env``'s states carry ``info["success"]``: what the env says (``has_success``,
    which adapters and wrappers know without tracing), else a shape trace of its reset."""
    known = getattr(env, "has_success", None)
    if known is not None:
        return bool(known)
    return "success" in jax.eval_shape(env.reset, jax.random.PRNGKey(0)).info

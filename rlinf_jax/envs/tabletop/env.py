"""The batched tabletop env: "put {object} on {target}" with chunked 7-D actions.

Follows the repo's env interface (`envs.base`): `reset(key)` and `step(state, action)` are
pure, batched over a leading [num_envs] axis and jittable, and the state is an `EnvState`
whose ``obs`` is a dict {"image": uint8 [B, H, W, 3], "tokens": int32 [B, L],
"proprio": float32 [B, 4]}. Besides, `reset_to(episode_ids)` starts given episodes, so the
envs of a GRPO group can share one reset state, and `reset(key)` draws ids from the
configured split, `group_size` consecutive envs sharing each.

An action is a chunk [B, K, 7] executed as K control sub-steps in one call (K =
`chunk_length`; a [B, 7] action is accepted when K = 1). Rewards are summed over the
sub-steps up to the one that ends the episode; later sub-steps are computed (every env runs
the same program) and discarded, so the returned state is the one the episode ended in.
The image is rendered once per call, after the chunk.

The episode ends at `max_steps` sub-steps (``truncated`` = 1) or, with
`terminate_on_success`, at success. ``info["success"]`` is 1 when the object lay on the
target pad at any sub-step of the chunk, which is what `EpisodeStats` turns into
``episode_success`` (RLinf's success_once).
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from mujoco import mjx

from rlinf_jax.envs.base import EnvState
from rlinf_jax.envs.tabletop import dynamics, episodes, language, render, scene
from rlinf_jax.envs.tabletop.dynamics import TabletopSim
from rlinf_jax.errors import BadInput


@dataclasses.dataclass(frozen=True)
class TabletopConfig:
    split: str = "train"  # train | vision | semantic | execution (what reset(key) draws)
    num_envs: int = 16
    image_size: int = 32  # square images; 32-64 px is what mjx.ray affords on a CPU
    chunk_length: int = 1  # sub-steps per step call (the policy's action chunk)
    max_steps: int = 80  # sub-steps per episode
    group_size: int = 1  # envs sharing an episode id in reset(key)
    terminate_on_success: bool = False
    layout: str = "random"  # random | task: cells drawn per episode or fixed per task (episodes.LAYOUTS)

    def validate(self) -> TabletopConfig:
        episodes.split_code(self.split)
        episodes.check_layout(self.layout)
        if not isinstance(self.terminate_on_success, bool):
            raise BadInput(f"tabletop terminate_on_success must be true or false, got {self.terminate_on_success!r}")
        for name in ("num_envs", "image_size", "chunk_length", "max_steps", "group_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise BadInput(f"tabletop {name} must be an integer >= 1, got {v!r}")
        if self.num_envs % self.group_size:
            raise BadInput(f"tabletop num_envs={self.num_envs} must be a multiple of group_size={self.group_size}")
        return self


# What one env's reset and step compute depends on its config less the split, batch size and
# group size (those pick which episodes, not how they run): (that config) -> (reset_one,
# step_one) under jit, shared by every TabletopEnv of it in the process. A run steps the
# tabletop in its demonstrations, its rollout and the evaluation of each split; tracing one
# step takes seconds (physics and rendering), and under jit JAX traces it once per process
# and batches it once per batch size.
_JITTED: dict[TabletopConfig, tuple] = {}


class TabletopEnv:
    """Batched, functional; see the module docstring. `TabletopEnv(split="vision", ...)`."""

    action_size = dynamics.ACTION_SIZE
    has_success = True  # every state's info holds "success"

    def __init__(self, config: TabletopConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or TabletopConfig(), **overrides).validate()
        c = self.config
        self.num_envs = c.num_envs
        self.chunk_length = c.chunk_length
        self.observation_shapes = {
            "image": (c.image_size, c.image_size, 3),
            "tokens": (language.MAX_TOKENS,),
            "proprio": (4,),
        }
        # The trainer's MLP path reads an int; a dict observation reports its parts instead.
        self.observation_size = self.observation_shapes
        # Ids the instruction tokens take: what a policy's embedding table must hold.
        self.vocab_size = language.vocab_size()
        # Where each proprio dimension lies (end-effector workspace, gripper 0..1): for a
        # policy that normalises the state to [-1, 1] (pi0.5 writes it into its prompt).
        self.proprio_range = (np.append(scene.EE_LOW, 0.0).astype(np.float32),
                              np.append(scene.EE_HIGH, 1.0).astype(np.float32))
        self.model = mjx.put_model(scene.mj_model())
        self.rays = jnp.asarray(scene.camera_rays(c.image_size))
        key = dataclasses.replace(c, split="train", num_envs=1, group_size=1)
        if key not in _JITTED:
            _JITTED[key] = (jax.jit(self.reset_one), jax.jit(self.step_one))
        self._reset_one, self._step_one = _JITTED[key]

    @property
    def unwrapped(self):
        return self

    # ---- one env, no batch axis ----

    def observe(self, sim: TabletopSim) -> dict:
        """One env's observation dict from its sim state (unbatched; vmap for a batch)."""
        d = dynamics.geom_poses(self.model, sim)
        return {
            "image": render.render(self.model, d, self.rays, sim.spec, sim.grip),
            "tokens": sim.spec.tokens,
            "proprio": dynamics.proprio(sim),
        }

    def _state(self, sim: TabletopSim, reward, done, truncated, success) -> EnvState:
        return EnvState(
            obs=self.observe(sim),
            reward=jnp.asarray(reward, jnp.float32),
            done=jnp.asarray(done, jnp.float32),
            truncated=jnp.asarray(truncated, jnp.float32),
            info={"success": jnp.asarray(success, jnp.float32), "eid": sim.spec.episode_id},
            sim=sim,
        )

    def reset_one(self, eid: jax.Array) -> EnvState:
        sim = dynamics.initial_sim(episodes.decode(eid, self.config.layout))
        z = jnp.zeros((), jnp.float32)
        return self._state(sim, z, z, z, dynamics.sim_reward(sim)["success"])

    def rollout_chunk(self, sim: TabletopSim, actions: jax.Array):
        """K sub-steps from `sim` ([K, 7] actions): (sim, reward sum, done, truncated, success).

        The first sub-step always runs (an env stepped past its end moves on, as with the
        other envs); after a sub-step that ends the episode the state is frozen.
        """
        c = self.config

        def body(carry, action):
            sim, total, done, trunc, success = carry
            nxt = dynamics.substep(self.model, sim, action)
            r = dynamics.sim_reward(nxt)
            timeout = nxt.t >= c.max_steps
            ends = timeout | ((r["success"] > 0) & c.terminate_on_success)
            keep = done > 0
            sim = jax.tree_util.tree_map(lambda a, b: jnp.where(keep, a, b), sim, nxt)
            total = total + jnp.where(keep, 0.0, r["reward"])
            success = jnp.where(keep, success, jnp.maximum(success, r["success"]))
            trunc = jnp.where(keep, trunc, (timeout & ~((r["success"] > 0) & c.terminate_on_success)))
            done = jnp.where(keep, done, ends)
            return (sim, total, done.astype(jnp.float32), trunc.astype(jnp.float32), success), None

        z = jnp.zeros((), jnp.float32)
        (sim, total, done, trunc, success), _ = jax.lax.scan(body, (sim, z, z, z, z), actions)
        return sim, total, done, trunc, success

    def step_one(self, state: EnvState, actions: jax.Array) -> EnvState:
        sim, total, done, trunc, success = self.rollout_chunk(state.sim, actions)
        return self._state(sim, total, done, trunc, success)

    # ---- batched interface ----

    def reset_to(self, episode_ids) -> EnvState:
        """Start the given episodes: int32 [num_envs] global ids (see `episodes.episode_id`)."""
        ids = jnp.asarray(episode_ids, jnp.int32)
        if ids.shape != (self.num_envs,):
            raise BadInput(f"reset_to needs {self.num_envs} episode ids, got shape {tuple(ids.shape)}")
        return jax.vmap(self._reset_one)(ids)

    def sample_episode_ids(self, key: jax.Array) -> jax.Array:
        c = self.config
        n = c.num_envs // c.group_size
        index = jax.random.randint(key, (n,), 0, episodes.SPLIT_SIZE, dtype=jnp.int32)
        ids = episodes.split_code(c.split) * episodes.SPLIT_SIZE + index
        return jnp.repeat(ids, c.group_size)

    def reset(self, key: jax.Array) -> EnvState:
        return self.reset_to(self.sample_episode_ids(key))

    def _chunk(self, action: jax.Array, batch: int) -> jax.Array:
        # ``batch`` is the state's, not num_envs: a pipelined runner steps micro-batches.
        action = jnp.asarray(action, jnp.float32)
        b, k = batch, self.chunk_length
        if action.shape == (b, self.action_size) and k == 1:
            return action[:, None]
        if action.shape != (b, k, self.action_size):
            raise BadInput(
                f"tabletop action must have shape [batch, chunk_length, 7] = [{b}, {k}, 7], got {list(action.shape)}"
            )
        return action

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        return jax.vmap(self._step_one)(state, self._chunk(action, state.reward.shape[0]))

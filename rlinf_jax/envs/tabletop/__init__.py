"""A jitted MJX tabletop benchmark for VLA policies: "put {object} on {target}".

- `env.TabletopEnv`: batched, chunked 7-D end-effector-delta actions, dict observations
  (image rendered with `mjx.ray`, instruction tokens, proprioception), dense shaped reward
  and success; `reset(key)` draws from a split, `reset_to(episode_ids)` replays episodes.
- `episodes`: an integer id decodes into an episode; disjoint id ranges give the train
  split and the vision / semantic / execution test splits.
- `expert`: a scripted expert and the demonstrations it produces for SFT.
- `language`: the instruction vocabulary, `encode` / `decode`.

See docs/tabletop.md.
"""

from rlinf_jax.envs.tabletop.catalog import instruction_text
from rlinf_jax.envs.tabletop.dynamics import ACTION_SIZE, TabletopSim, reward_terms
from rlinf_jax.envs.tabletop.env import TabletopConfig, TabletopEnv
from rlinf_jax.envs.tabletop.episodes import (
    SPLITS,
    EpisodeSpec,
    decode,
    describe,
    episode_id,
    episode_spec,
    instruction,
    split_of,
)
from rlinf_jax.envs.tabletop.expert import (
    collect_demos,
    demo_dataset,
    expert_action,
    expert_actions,
    rollout_expert,
)
from rlinf_jax.envs.tabletop.language import decode as decode_tokens
from rlinf_jax.envs.tabletop.language import encode as encode_instruction
from rlinf_jax.envs.tabletop.language import vocab_size

__all__ = [
    "ACTION_SIZE",
    "SPLITS",
    "EpisodeSpec",
    "TabletopConfig",
    "TabletopEnv",
    "TabletopSim",
    "collect_demos",
    "decode",
    "decode_tokens",
    "demo_dataset",
    "describe",
    "encode_instruction",
    "episode_id",
    "episode_spec",
    "expert_action",
    "expert_actions",
    "instruction",
    "instruction_text",
    "reward_terms",
    "rollout_expert",
    "split_of",
    "vocab_size",
]

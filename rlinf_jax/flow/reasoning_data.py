"""The ``data:`` and ``reward:`` config sections as the data and reward layers' own configs.

The schema mirrors `rlinf_jax.data.DataConfig` and `rlinf_jax.rewards.RewardConfig` (lists
where they hold tuples, plus the flow's batch settings); these turn a section back into
the layer's config, copying by field name so a field added there is picked up here.
"""

from __future__ import annotations

import dataclasses

from rlinf_jax.config.schema import Config
from rlinf_jax.data import DataConfig
from rlinf_jax.rewards import RewardConfig


def data_config(cfg: Config, train_levels=None) -> DataConfig:
    """``cfg.data`` as a validated `DataConfig`; ``train_levels`` overrides the train levels."""
    section = dataclasses.asdict(cfg.data)
    kwargs = {f.name: section[f.name] for f in dataclasses.fields(DataConfig)}
    for name in ("train_levels", "eval_levels"):
        kwargs[name] = tuple(kwargs[name])
    if train_levels:
        kwargs["train_levels"] = tuple(train_levels)
    return DataConfig(**kwargs).validate()


def reward_config(cfg: Config) -> RewardConfig:
    section = dataclasses.asdict(cfg.reward)
    return RewardConfig(**{f.name: section[f.name] for f in dataclasses.fields(RewardConfig)}).validate()

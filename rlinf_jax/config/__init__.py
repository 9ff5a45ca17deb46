"""Typed configs: the schema dataclasses and the recipe loader."""

from rlinf_jax.config.loader import config_to_yaml, list_recipes, load_config, load_config_file, validate
from rlinf_jax.config.schema import Config

__all__ = ["Config", "config_to_yaml", "list_recipes", "load_config", "load_config_file", "validate"]

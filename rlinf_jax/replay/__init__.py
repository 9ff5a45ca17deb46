"""Replay: transitions kept on devices for off-policy learning (a flashbax buffer inside the
jitted loop), fixed datasets of transitions (demonstrations, offline data) and their
on-disk format."""

from rlinf_jax.replay.buffer import ReplayBuffer, TransitionBatch
from rlinf_jax.replay.dataset import TransitionDataset
from rlinf_jax.replay.files import read_transitions, write_transitions

__all__ = ["ReplayBuffer", "TransitionBatch", "TransitionDataset", "read_transitions", "write_transitions"]

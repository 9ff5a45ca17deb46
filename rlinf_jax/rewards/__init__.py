"""Verifiable rewards for reasoning RL: answer checking, format reward, overlong shaping.

Importing this package does not import JAX (checker worker processes import it).
"""

from rlinf_jax.rewards.answers import (
    FALLBACKS,
    MathAnswerChecker,
    boxed_contents,
    extract_answer,
    format_ok,
    last_number,
)
from rlinf_jax.rewards.config import RewardConfig
from rlinf_jax.rewards.pool import CheckerPool, call_with_timeout
from rlinf_jax.rewards.reward_fn import RewardFunction, RewardResult
from rlinf_jax.rewards.shaping import overlong_penalty

__all__ = [
    "FALLBACKS",
    "CheckerPool",
    "MathAnswerChecker",
    "RewardConfig",
    "RewardFunction",
    "RewardResult",
    "boxed_contents",
    "call_with_timeout",
    "extract_answer",
    "format_ok",
    "last_number",
    "overlong_penalty",
]

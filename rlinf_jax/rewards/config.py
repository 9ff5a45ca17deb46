"""Settings of the reasoning reward (the ``reward:`` section of a reasoning recipe)."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_jax.errors import BadInput
from rlinf_jax.rewards.answers import FALLBACKS


@dataclass
class RewardConfig:
    # Accuracy: reward for a correct / wrong final answer.
    correct_reward: float = 1.0
    wrong_reward: float = 0.0
    # No \boxed{} in the response: "last_number", "math_verify" (its own search) or "none" (0).
    fallback: str = "last_number"
    # Integer references checked in pure Python when the candidate is an integer.
    fast_path: bool = True
    # Format reward added on top: format_reward if the response has exactly one \boxed{}
    # (and format_tag, when set, e.g. "</think>"); 0 disables.
    format_reward: float = 0.0
    format_tag: str = ""
    # DAPO overlong shaping on response lengths in tokens: 0 below
    # overlong_max_len - overlong_cache_len, a linear ramp to -1 at overlong_max_len, -1 beyond;
    # times overlong_factor. overlong_max_len=0 disables.
    overlong_max_len: int = 0
    overlong_cache_len: int = 0
    overlong_factor: float = 1.0
    # Checker processes: -1 = min(8, CPU count), 0 = in this process (alarm timeout only in
    # the main thread), n = n processes.
    num_workers: int = -1
    # Seconds one check may take before it scores 0 and counts in reward/timeouts.
    timeout_s: float = 5.0

    def validate(self) -> RewardConfig:
        if self.fallback not in FALLBACKS:
            raise BadInput(f"reward.fallback={self.fallback!r} is unknown; use one of {', '.join(FALLBACKS)}")
        if not self.timeout_s > 0:
            raise BadInput(f"reward.timeout_s={self.timeout_s} must be positive")
        if self.num_workers < -1:
            raise BadInput(f"reward.num_workers={self.num_workers} must be -1 (auto), 0 (in process) or a worker count")
        if self.overlong_max_len < 0:
            raise BadInput(f"reward.overlong_max_len={self.overlong_max_len} must be >= 0 (0 disables)")
        if self.overlong_max_len > 0 and not 0 < self.overlong_cache_len <= self.overlong_max_len:
            raise BadInput(
                f"reward.overlong_cache_len={self.overlong_cache_len} must lie in (0, overlong_max_len="
                f"{self.overlong_max_len}] when overlong shaping is on"
            )
        if self.format_tag and not self.format_reward:
            raise BadInput("reward.format_tag is set but reward.format_reward is 0; set a format reward or drop the tag")
        return self

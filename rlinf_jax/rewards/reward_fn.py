"""The reasoning reward: accuracy + optional format reward + optional DAPO overlong shaping.

``RewardFunction(cfg)(responses, answers, lengths)`` scores one rollout batch on the host.
Integer answers that ``MathAnswerChecker.fast`` can settle never leave this process (under the
same time limit as the pool's calls); the rest go to a pool of checker processes
(``rlinf_jax.rewards.pool``). A check that raises or times
out makes that sample's whole reward 0 (no format or length terms either: we know nothing
about it) and is counted in ``reward/errors`` / ``reward/timeouts``; the run goes on.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field

import numpy as np

from rlinf_jax.rewards.answers import MathAnswerChecker, format_ok
from rlinf_jax.rewards.config import RewardConfig
from rlinf_jax.rewards.pool import CheckerPool, call_with_timeout
from rlinf_jax.rewards.shaping import overlong_penalty


@dataclass
class RewardResult:
    rewards: np.ndarray  # [N] float32, the total reward per response
    metrics: dict = field(default_factory=dict)  # "reward/..." -> float
    correct: np.ndarray | None = None  # [N] float32 accuracy score in [0, 1] (0 where the check failed)
    failed: np.ndarray | None = None  # [N] bool, the check raised or timed out


class RewardFunction:
    """Scores responses against reference answers; see ``RewardConfig`` for the terms.

    ``checker``: any picklable ``(response, answer) -> float in [0, 1]`` (default:
    ``MathAnswerChecker(cfg.fallback)``); when it has a ``fast(response, answer)`` method
    returning a score or None, that runs first, in process. Close with ``close()`` or use as a
    context manager (the checker processes are reused across calls).
    """

    def __init__(self, cfg: RewardConfig | None = None, checker=None):
        self.cfg = (cfg if cfg is not None else RewardConfig()).validate()
        self.checker = checker if checker is not None else MathAnswerChecker(self.cfg.fallback)
        n = self.cfg.num_workers
        self.num_workers = min(8, os.cpu_count() or 1) if n == -1 else n
        if self.num_workers > 0:
            try:
                pickle.dumps(self.checker)
            except Exception as e:
                raise TypeError(f"the reward checker must be picklable to run in checker processes ({e})") from None
        self._pool: CheckerPool | None = None

    def _check(self, items):
        """``[(status, score)]`` for ``[(response, answer)]`` outside the fast path."""
        if not items:
            return []
        if self.num_workers == 0:
            return [call_with_timeout(self.checker, it, self.cfg.timeout_s) for it in items]
        if self._pool is None:
            self._pool = CheckerPool(self.num_workers, self.cfg.timeout_s)
        return self._pool.map(self.checker, items)

    def _in_process(self, response: str, answer: str) -> tuple[float | None, float]:
        """The checker's fast score (None: needs the full check) and the format test."""
        fast = getattr(self.checker, "fast", None) if self.cfg.fast_path else None
        score = fast(response, answer) if fast is not None else None
        fmt = float(format_ok(response, self.cfg.format_tag)) if self.cfg.format_reward else 0.0
        return score, fmt

    def __call__(self, responses, answers, lengths=None) -> RewardResult:
        cfg = self.cfg
        n = len(responses)
        if len(answers) != n:
            raise ValueError(f"{n} responses but {len(answers)} answers")
        correct = np.zeros(n, np.float32)
        fmt = np.zeros(n, np.float32)
        status = ["ok"] * n
        slow, settled = [], 0
        for i, (r, a) in enumerate(zip(responses, answers)):
            # The in-process part is bounded like the checker processes: one sample that
            # trips it (a pathological text, a checker bug) scores 0 and is counted.
            st, value = call_with_timeout(self._in_process, (r, a), cfg.timeout_s)
            if st != "ok":
                status[i] = st
                continue
            score, fmt[i] = value
            if score is None:
                slow.append(i)
            else:
                correct[i], settled = score, settled + 1
        for i, (st, value) in zip(slow, self._check([(responses[i], answers[i]) for i in slow])):
            status[i] = st
            if st == "ok":
                try:
                    correct[i] = np.clip(float(value), 0.0, 1.0)
                except (TypeError, ValueError):
                    status[i] = "error"  # a checker returning something that is not a score
        failed = np.array([st != "ok" for st in status], bool)
        correct[failed] = 0.0

        rewards = cfg.wrong_reward + (cfg.correct_reward - cfg.wrong_reward) * correct
        metrics = {"reward/accuracy": float(correct.mean()) if n else 0.0}
        if cfg.format_reward:
            rewards = rewards + cfg.format_reward * fmt
            metrics["reward/format"] = float(fmt.mean()) if n else 0.0
        if cfg.overlong_max_len > 0:
            if lengths is None or len(lengths) != n:
                raise ValueError("overlong shaping needs one response length per response")
            pen = overlong_penalty(lengths, cfg.overlong_max_len, cfg.overlong_cache_len)
            rewards = rewards + cfg.overlong_factor * pen
            metrics["reward/overlong_penalty"] = float(pen.mean()) if n else 0.0
            metrics["reward/overlong_frac"] = float((pen < 0).mean()) if n else 0.0
        rewards = np.where(failed, 0.0, rewards).astype(np.float32)
        metrics.update(
            {
                "reward/mean": float(rewards.mean()) if n else 0.0,
                "reward/errors": float(status.count("error")),
                "reward/timeouts": float(status.count("timeout")),
                "reward/fast_path": settled / n if n else 0.0,
            }
        )
        return RewardResult(rewards=rewards, metrics=metrics, correct=correct, failed=failed)

    def close(self):
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        # A reward function sent elsewhere starts its own checker processes there.
        state = dict(self.__dict__)
        state["_pool"] = None
        return state

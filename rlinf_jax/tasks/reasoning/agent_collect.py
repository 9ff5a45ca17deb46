"""The rollout half of an agentic reasoning iteration (``agent.enabled``): ``group_size``
episodes per prompt of the recipe's text environment (`rlinf_jax.agents.ToolEnv`: tool calls
in the worker pool, the final answer scored by the math checker; or a SkyRL-gym one), run by
`rlinf_jax.rollout.multi_turn`.

The batch has the single-turn layout (``[prompt | response]``) with the episode as the
response: ``response_mask`` is the loss mask (the model's tokens), ``response_valid`` every
token the model reads (observations too), and per turn ``turn_ids`` / ``turn_rewards`` /
``turn_valid`` for `rlinf_jax.algos.grpo_dynamic`. Each turn carries its episode's reward,
as RLinf's multi-turn runners give it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from rlinf_jax.agents import TextEnv
from rlinf_jax.data import PromptLoader, eval_batches
from rlinf_jax.rewards import RewardConfig
from rlinf_jax.rollout.lm_io import PromptEncoder
from rlinf_jax.rollout.multi_turn import Episodes, MultiTurnRollout, episode_metrics
from rlinf_jax.rollout.sampler import bucket_length


def level_accuracy(correct, levels, name: str) -> dict:
    """``{name}_level<k>``: accuracy per difficulty level of procedural rows (as the
    single-turn evaluation reports it), to see which levels a gain or a failure comes from;
    empty when the rows carry no integer levels or only one."""
    if not levels or not all(isinstance(v, int) for v in levels) or len(set(levels)) < 2:
        return {}
    levels = np.asarray(levels)
    return {f"{name}_level{k}": float(correct[levels == k].mean()) for k in sorted(set(levels.tolist()))}


@dataclass
class AgentCollector:
    rollout: MultiTurnRollout
    encoder: PromptEncoder
    make_env: Callable[[], TextEnv]  # a fresh environment per episode (`agents.factory.env_factory`)
    reward: RewardConfig
    loader: PromptLoader
    num_prompts: int
    group: int
    temperature: float
    top_p: float = 1.0
    top_k: int = 0

    @property
    def samples(self) -> int:
        return self.num_prompts * self.group

    def episodes(self, records, key, temperature, sample_ids=None) -> tuple[Episodes, list]:
        """Episodes of ``records`` and their prompts' token ids."""
        envs = [self.make_env() for _ in records]
        prompts: list = []

        def encode(texts):
            prompts.extend(self.encoder.encode(texts, [r.get("id") for r in records]))
            return prompts

        ep = self.rollout.run(envs, records, key, encode=encode, temperature=temperature, top_p=self.top_p,
                              top_k=self.top_k, sample_ids=sample_ids)
        return ep, prompts

    def batch(self, key) -> tuple[dict, dict]:
        b = next(self.loader)
        records = [r for r in b.records for _ in range(self.group)]
        t0 = time.perf_counter()
        ep, prompts = self.episodes(records, key, self.temperature, np.arange(self.samples, dtype=np.uint32))
        dt = time.perf_counter() - t0
        r = self.reward
        correct = ep.rewards
        rewards = (r.wrong_reward + (r.correct_reward - r.wrong_reward) * correct).astype(np.float32)
        prompt_ids, prompt_mask = self.encoder.pad(prompts)
        T = self.rollout.limits.max_turns
        turn_valid = np.arange(T)[None] < ep.num_turns[:, None]
        width = min(bucket_length(int(ep.valid.sum(axis=1).max()), 16), ep.tokens.shape[1])
        batch = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "tokens": ep.tokens[:, :width],
            "response_mask": ep.loss_mask[:, :width].astype(np.float32),
            "response_valid": ep.valid[:, :width].astype(np.float32),
            "sampler_logp": ep.logprobs[:, :width],
            "rewards": rewards,
            "turn_ids": ep.turn_ids[:, :width],
            "turn_rewards": np.where(turn_valid, rewards[:, None], 0.0).astype(np.float32),
            "turn_valid": turn_valid,
        }
        generated = ep.loss_mask.sum()
        groups = rewards.reshape(-1, self.group)
        metrics = {
            "rollout/reward_mean": float(rewards.mean()),
            # Groups whose episodes all scored the same get a zero GRPO advantage: no gradient.
            "rollout/uniform_groups": float((groups.max(axis=1) == groups.min(axis=1)).mean()),
            "rollout/accuracy": float(correct.mean()),
            "rollout/response_length": float(ep.valid.sum(axis=1).mean()),
            "time/rollout_sec": dt,
            "rollout/tokens_per_sec": float(generated / max(dt, 1e-9)),
            **{f"rollout/{k}": v for k, v in episode_metrics(ep).items()},
        }
        return batch, metrics

    def evaluate(self, dataset, key, batch_size: int, temperature: float) -> dict:
        """Accuracy of episodes on ``dataset`` (greedy with ``temperature=0``) and their
        per-turn statistics, as ``eval/*``."""
        correct, stats, n, levels = [], {}, 0, []
        for i, recs in enumerate(eval_batches(dataset, batch_size)):
            recs = list(recs.records)
            levels.extend(r.get("level") for r in recs)
            ep, _ = self.episodes(recs, key, temperature, np.arange(n, n + len(recs), dtype=np.uint32))
            correct.append(ep.rewards)
            for k, v in episode_metrics(ep).items():
                stats[k] = stats.get(k, 0.0) + v * len(recs)
            n += len(recs)
        correct = np.concatenate(correct)
        out = {"eval/accuracy": float(correct.mean()), **level_accuracy(correct, levels, "eval/accuracy")}
        out.update({f"eval/{k}": v / n for k, v in stats.items()})
        return out


"""What an sft and a reasoning run share before training: data, model, tokenizer, prompt
encoder, LoRA, the sampler that evaluates (and, in RL, generates), and the reward that
scores answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rlinf_jax import kernels
from rlinf_jax.config.schema import Config
from rlinf_jax.data import PromptDataset, PromptLoader, build_datasets, run_tokenizer
from rlinf_jax.flow.trainer import Trainer
from rlinf_jax.policies.lm import LMConfig
from rlinf_jax.policies.lm.hf_checkpoint import parse_dtype
from rlinf_jax.policies.lm.lora import LoRA
from rlinf_jax.policies.lm.qlora import QLoRA
from rlinf_jax.rewards import RewardFunction
from rlinf_jax.rewards.split import SplitRewards
from rlinf_jax.rollout.lm_io import PromptEncoder, make_sampler, pad_id, stop_tokens
from rlinf_jax.rollout.sampler import Sampler, SamplingParams
from rlinf_jax.rollout.scoring import score_dataset
from rlinf_jax.sharding import Placement
from rlinf_jax.sharding.mesh import fetch
from rlinf_jax.tasks.sft.lm_model import checkpoint_meta, load_policy


@dataclass
class LMSetup:
    train_ds: PromptDataset
    eval_ds: PromptDataset | None
    model_source: str  # where the weights came from, for people
    lm_config: LMConfig
    tokenizer: Any
    encoder: PromptEncoder
    graphdef: Any
    params: dict  # {"policy": nnx.State} (+ "lora": adapters; the policy is then frozen)
    lora: LoRA | None
    meta: dict  # what every checkpoint's metadata carries (model config, tokenizer, LoRA)
    sampler: Sampler
    reward_fn: SplitRewards
    stop_tokens: tuple[int, ...]

    def eval_sampling(self, cfg: Config) -> SamplingParams:
        ro = cfg.rollout
        return SamplingParams(ro.max_new_tokens, ro.eval_temperature, ro.top_p, ro.top_k, self.stop_tokens)


def make_lm_setup(cfg: Config, sampler_mesh, rules, num_devices: int) -> LMSetup:
    """Data first (a bad file fails before any model is built), then the model of
    ``actor.model`` (its product backend checked against the run's ``num_devices``), its
    tokenizer, LoRA adapters when ``actor.model.lora_rank`` > 0, the sampler on
    ``sampler_mesh`` and the reward function of ``reward``."""
    train_ds, eval_ds = build_datasets(cfg.data)
    kernels.check_backend(cfg.actor.model.matmul, parse_dtype(cfg.actor.model.dtype), num_devices)
    loaded = load_policy(cfg)
    tokenizer = run_tokenizer(cfg.data.tokenizer, loaded.model.config.vocab_size)
    graphdef, policy = nnx.split(loaded.model)
    meta = checkpoint_meta(loaded.model, cfg.data.tokenizer)
    lora = make_lora(policy, cfg.actor.model)
    params = trainable_params(policy, lora, cfg.runner.seed)
    if lora is not None:
        meta["lora"] = lora.meta()
    encoder = PromptEncoder(cfg.data, tokenizer)
    encoder.check_lengths(train_ds, "training")
    if eval_ds is not None:
        encoder.check_lengths(eval_ds, "evaluation")
    return LMSetup(
        train_ds=train_ds,
        eval_ds=eval_ds,
        model_source=loaded.source,
        lm_config=loaded.model.config,
        tokenizer=tokenizer,
        encoder=encoder,
        graphdef=graphdef,
        params=params,
        lora=lora,
        meta=meta,
        sampler=make_sampler(loaded.model, pad_id(tokenizer), sampler_mesh, rules),
        reward_fn=SplitRewards(RewardFunction(cfg.reward)),
        stop_tokens=stop_tokens(tokenizer),
    )


def make_lora(policy, m) -> LoRA | None:
    """The adapters ``actor.model`` asks for (``m.lora_rank`` > 0; QLoRA with an NF4 base),
    sized from the policy's state (real or abstract), or None for full fine-tuning."""
    if m.lora_rank <= 0:
        return None
    if m.base_qtype == "none":
        return LoRA(policy, m.lora_rank, m.lora_alpha)
    return QLoRA(policy, m.lora_rank, m.lora_alpha, m.base_qtype)


def trainable_params(policy, lora: LoRA | None, seed: int) -> dict:
    """What an LM run trains from: ``{"policy": state}``, or with adapters the frozen base
    (QLoRA: stored in NF4, dequantised inside each step) and the ``"lora"`` adapters. Under
    `jax.eval_shape` on an abstract state it sizes them (the planner's use)."""
    if lora is None:
        return {"policy": policy}
    base = lora.quantize(policy) if isinstance(lora, QLoRA) else policy
    return {"policy": base, "lora": lora.init(jax.random.PRNGKey(seed + 1))}


SHOWN_SAMPLES = 8  # held-out answers shown in TensorBoard at each evaluation


class LMTrainer(Trainer):
    """What the sft and reasoning trainers share: the data cursor and model config in each
    checkpoint's metadata, progress read from the state, the reward's processes closed.
    Besides `Trainer`, the LM loop (`tasks.sft.loop`) reads exactly the attributes below;
    each trainer sets them in its constructor."""

    task: str  # the runner.task the checkpoints record
    placement: Placement  # the layout it runs (placement.json)
    model_source: str  # where the weights came from (placement.json, for people)
    samples_per_iteration: int  # sequences one iteration trains on (the run summary's throughput)
    last_samples: list | None = None  # the newest evaluation's first held-out records
    lm: LMSetup
    loader: PromptLoader

    def meta(self) -> dict:
        return {**self.lm.meta, "loader": self.loader.state_dict(), "task": self.task}

    def load_meta(self, meta: dict) -> None:
        if "loader" in meta:
            self.loader.load_state_dict(meta["loader"])

    def progress(self, ts) -> tuple[int, int]:
        step, bad = fetch((ts.step, ts.bad_iterations))
        return int(step), int(bad)

    def close(self) -> None:
        self.lm.reward_fn.close()

    def score_heldout(self, sampler, sampling, key, progress=None) -> dict:
        """``eval/*`` of ``sampler`` on the held-out split; keeps the first problems' records
        (prompt, answer, responses, correct) as ``last_samples`` for TensorBoard."""
        result = score_dataset(sampler, self.lm.encoder, self.lm.reward_fn, self.lm.eval_ds, sampling, key,
                               self.cfg.rollout.eval_batch_size, progress=progress, keep_responses=True)
        self.last_samples = result.pop("records")[:SHOWN_SAMPLES]
        return {f"eval/{k}": v for k, v in result.items() if k != "pass@1"}


def policy_weights(lora: LoRA | None, params: dict):
    """The policy's weights: the parameters, or the frozen base merged with the adapters."""
    if lora is None:
        return params["policy"]
    return lora.merge(jax.lax.stop_gradient(params["policy"]), params["lora"])


def trainable_value_and_grad(fn, lora: LoRA | None, has_aux: bool = False):
    """``jax.value_and_grad(fn)`` for ``fn(params, *args)``, differentiating only what the
    optimiser trains.

    With LoRA the base (``params["policy"]``) is frozen: its gradient is zero by construction
    (`policy_weights` stops it), and a QLoRA base holds integer codes, which autodiff refuses.
    So the base enters ``fn`` as a constant and its gradient comes back as one float32 zero
    per leaf (`zero_grads`), which the optimiser's ``set_to_zero`` passes on and the update
    adds as 0: a base-sized array of zeros is never made, nor summed over micro-batches.
    """
    if lora is None:
        return jax.value_and_grad(fn, has_aux=has_aux)

    def value_and_grad(params, *args):
        frozen = params["policy"]
        trained = {k: v for k, v in params.items() if k != "policy"}
        out, grads = jax.value_and_grad(lambda t: fn({**t, "policy": frozen}, *args), has_aux=has_aux)(trained)
        return out, {**grads, "policy": _frozen_zeros(frozen)}

    return value_and_grad


def zero_grads(lora: LoRA | None, params: dict):
    """The start of a gradient sum over micro-batches, shaped as `trainable_value_and_grad`
    returns gradients."""
    zeros = jax.tree.map(jnp.zeros_like, {k: v for k, v in params.items() if lora is None or k != "policy"})
    return zeros if lora is None else {**zeros, "policy": _frozen_zeros(params["policy"])}


def _frozen_zeros(frozen):
    return jax.tree.map(lambda _: jnp.zeros((), jnp.float32), frozen)


def param_labels(params: dict) -> dict:
    """Each top-level part of the parameters (policy, lora, value) labelled by its name."""
    return {k: jax.tree.map(lambda _, k=k: k, v) for k, v in params.items()}


def lm_transform(tx, lora: LoRA | None, **others) -> optax.GradientTransformation:
    """``tx`` on the policy (or on its adapters, the base frozen) and ``others`` on the
    parts of those names (e.g. ``value=...``)."""
    parts = {"policy": tx} if lora is None else {"policy": optax.set_to_zero(), "lora": tx}
    return optax.multi_transform({**parts, **others}, param_labels)

"""Supervised fine-tuning of a causal LM on prompt -> ``\\boxed{answer}`` targets.

The warm start of reasoning RL (a random model earns no reward, so RL has nothing to
reinforce) and a task of its own (``runner.task=sft``). One optimiser step takes
``actor.global_batch_size`` examples, cut into micro-batches of ``actor.micro_batch_size``
whose gradients are summed inside the jitted step (gradient accumulation); the loss is the
token mean of the targets' negative log-likelihood over the whole step's batch, so the
result does not depend on the micro-batch size. Prompt tokens carry no loss.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from rlinf_jax.array_types import Count
from rlinf_jax.config.schema import Config
from rlinf_jax.data import PromptLoader, boxed_response
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.optim import clipped_adamw, guarded_update
from rlinf_jax.policies.lm.logprobs import policy_logprobs
from rlinf_jax.policies.lm.lora import LoRA
from rlinf_jax.rollout.lm_io import encode_targets, encode_transcripts, sync_sampler
from rlinf_jax.sharding import (
    component_mesh,
    param_shardings,
    place_rows,
    resolve_num_devices,
    resolve_placement,
    rules_from_config,
    state_shardings,
)
from rlinf_jax.sharding.mesh import fetch, put, replicated
from rlinf_jax.tasks.sft.lm_setup import (
    LMTrainer,
    lm_transform,
    make_lm_setup,
    policy_weights,
    trainable_value_and_grad,
    zero_grads,
)

COMPONENTS = ("actor",)


@struct.dataclass
class LMTrainState:
    params: Any  # {"policy": nnx.State} (+ "lora": adapters, the policy then frozen)
    opt_state: Any
    step: Count
    # Consecutive steps skipped for a non-finite loss or gradient.
    bad_iterations: Count


@dataclass(frozen=True)
class SFTStep:
    """The static parts of one SFT step."""

    graphdef: Any
    lora: LoRA | None
    tx: optax.GradientTransformation
    schedule: Any
    micro_batch_size: int
    logits_chunk: int = 0  # actor.model.logits_chunk


def micro_loss(s: SFTStep, params, mb: dict, total):
    """One micro-batch's share of the step's loss: its targets' summed negative
    log-likelihood over ``total``, the target tokens of the whole step."""
    model = nnx.merge(s.graphdef, policy_weights(s.lora, params))
    logp, _ = policy_logprobs(model, mb, logits_chunk=s.logits_chunk)
    m = mb["response_mask"] > 0
    return -jnp.sum(jnp.where(m, logp, 0.0)) / total


def train_step(s: SFTStep, ts: LMTrainState, batch: dict):
    """One guarded optimiser step on ``batch`` (the token-mean NLL of its targets)."""
    B = batch["tokens"].shape[0]
    n_micro = B // s.micro_batch_size
    total = jnp.maximum(jnp.sum(batch["response_mask"]), 1).astype(jnp.float32)
    micro = jax.tree.map(lambda x: x.reshape(n_micro, s.micro_batch_size, *x.shape[1:]), batch)
    grad_fn = trainable_value_and_grad(lambda params, mb: micro_loss(s, params, mb, total), s.lora)

    def accumulate(grads, mb):
        loss, g = grad_fn(ts.params, mb)
        return jax.tree.map(jnp.add, grads, g), loss

    grads, losses = jax.lax.scan(accumulate, zero_grads(s.lora, ts.params), micro)
    loss = jnp.sum(losses)
    params, opt_state, ok = guarded_update(s.tx, grads, ts.params, ts.opt_state, loss)
    new = ts.replace(
        params=params, opt_state=opt_state, step=ts.step + 1, bad_iterations=jnp.where(ok, 0, ts.bad_iterations + 1)
    )
    metrics = {
        "train/loss": jnp.where(ok, loss, 0.0),
        "train/grad_norm": jnp.where(ok, optax.tree.norm(grads), 0.0),
        "train/lr": jnp.asarray(s.schedule(ts.step), jnp.float32),
        "train/target_tokens": total,
        "train/skipped_updates": (~ok).astype(jnp.float32),
    }
    return new, metrics


class SFTTrainer(LMTrainer):
    task = "sft"

    def __init__(self, cfg: Config, placement=None, devices=None):
        self.cfg = cfg
        num_devices = resolve_num_devices(cfg.cluster.num_devices)
        devices = jax.devices()[:num_devices] if devices is None else devices
        if cfg.cluster.scaling == "dynamic":
            raise BadInput("cluster.scaling=dynamic lends devices between components, and supervised fine-tuning has "
                           "one (the actor): use cluster.scaling=static")
        if placement is None:
            placement = resolve_placement(cfg.cluster.component_placement, COMPONENTS, len(devices), cfg.cluster.mesh)
        self.placement = placement
        self.mesh = component_mesh(placement, "actor", devices)
        self.rules = rules_from_config(cfg.cluster.partition_rules)
        lm = self.lm = make_lm_setup(cfg, self.mesh, self.rules, len(devices))
        self.model_source, self.tokenizer, self.lora = lm.model_source, lm.tokenizer, lm.lora
        self.loader = PromptLoader(lm.train_ds, cfg.actor.global_batch_size, cfg.data.seed, cfg.data.shuffle)
        self.param_shardings = param_shardings(lm.params, self.mesh, self.rules)
        self._init_params = put(lm.params, self.param_shardings)
        o = cfg.actor.optim
        tx, schedule = clipped_adamw(o.lr, o.max_grad_norm, o.weight_decay, o.warmup_steps, o.lr_schedule, cfg.runner.max_steps)
        self.tx = lm_transform(tx, self.lora)
        self.batch_size = cfg.actor.global_batch_size
        self.micro = cfg.actor.micro_batch_size
        self.step_spec = SFTStep(lm.graphdef, self.lora, self.tx, schedule, self.micro, cfg.actor.model.logits_chunk)
        self._step = jax.jit(
            functools.partial(train_step, self.step_spec), donate_argnums=0, out_shardings=(self._state_shardings(), None)
        )
        self._merged_policy = jax.jit(functools.partial(policy_weights, self.lora))
        self.samples_per_iteration = self.batch_size

    # ------------------------------------------------------------------ state
    def _state_shardings(self):
        opt = jax.eval_shape(self.tx.init, self._init_params)
        rep = replicated(self.mesh)
        return LMTrainState(self.param_shardings, state_shardings(opt, self.mesh, self.rules), rep, rep)

    def init(self) -> LMTrainState:
        params = jax.tree.map(jnp.copy, self._init_params)
        return self.start(LMTrainState(
            params=params,
            opt_state=jax.jit(self.tx.init)(params),
            step=jnp.zeros((), jnp.int32),
            bad_iterations=jnp.zeros((), jnp.int32),
        ))

    def start(self, ts: LMTrainState) -> LMTrainState:
        """Lays a (restored) state out as the step returns it, so the step compiles once."""
        return jax.tree.map(lambda x, s: put(x, s), ts, self._state_shardings())

    # ------------------------------------------------------------------ steps
    def next_batch(self) -> dict:
        b = next(self.loader)
        prompt_ids, prompt_mask = self.lm.encoder(b.prompts, b.ids)
        width = self.cfg.rollout.max_new_tokens
        if any("target" in r for r in b.records):
            # Records with their own target (tool-use transcripts, rlinf_jax.data.tool_tasks):
            # the loss on the model's text, the tool results read but not scored.
            targets = [r.get("target") or boxed_response(a) for r, a in zip(b.records, b.answers)]
            tokens, mask, valid = encode_transcripts(self.tokenizer, targets, width)
            batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "tokens": tokens, "response_mask": mask,
                     "response_valid": valid}
        else:
            tokens, mask = encode_targets(self.tokenizer, [boxed_response(a) for a in b.answers], width)
            batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "tokens": tokens, "response_mask": mask}
        return place_rows(batch, self.mesh, self.micro)

    def run_iterations(self, ts: LMTrainState, n: int):
        sums = None
        t0 = time.perf_counter()
        for _ in range(n):
            ts, metrics = self._step(ts, self.next_batch())
            sums = metrics if sums is None else jax.tree.map(jnp.add, sums, metrics)
        sums = {k: float(v) for k, v in fetch(sums).items()}
        dt = time.perf_counter() - t0
        out = {k: v / n for k, v in sums.items() if k != "train/skipped_updates"}
        out["train/skipped_updates"] = sums["train/skipped_updates"]
        out["time/step_sec"] = dt / n
        out["time/samples_per_sec"] = n * self.batch_size / dt
        return ts, out

    # ------------------------------------------------------------------ eval
    def run_eval(self, ts: LMTrainState, key, progress=None) -> dict:
        if self.lm.eval_ds is None:
            return {}
        sync_sampler(self.lm.sampler, ts.params["policy"] if self.lora is None else self._merged_policy(ts.params))
        return self.score_heldout(self.lm.sampler, self.lm.eval_sampling(self.cfg), key, progress)


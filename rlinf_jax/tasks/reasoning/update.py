"""The actor's half of a reasoning iteration as pure functions: old log-probs and values,
advantages, and PPO-style epochs over mini-batches of micro-batches.

A mini-batch's loss is the ``algorithm.lm.loss_agg`` aggregate over all its tokens or
sequences: each micro-batch's aggregate is weighted by its share of the mini-batch's
tokens (token-mean) or sequences (seq-*), so gradient accumulation gives the gradient of
the whole mini-batch, whatever the micro-batch size. With one epoch and one mini-batch
the update is exactly on-policy and the old log-probs are the current ones (no extra
forward pass); otherwise they are recomputed with the pre-update parameters.

The rollout samples each prompt ``group_size`` times in consecutive rows. When every
micro-batch holds whole groups (one mini-batch, so the rows are never shuffled, and a
micro-batch size the group size divides) the log-probs run each prompt once per group
(``prompt_group``, see `rlinf_jax.policies.lm.logprobs`): same numbers up to float
rounding, the prompt's share of the forward and backward work divided by the group size.

Advantages by ``algorithm.adv_type``: group estimators (grpo, dr_grpo, rloo) give one value
per response, spread over its tokens; reinforce_pp / reinforce_pp_baseline work on token
rewards (the outcome on the last token, minus ``kl_coef * KL`` per token with
``kl_in_reward``); gae runs a value model with the reward on the last token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec

from rlinf_jax.array_types import Count
from rlinf_jax.algos import GROUP_OUTCOME_ADVANTAGES, aggregate, get_advantage, get_policy_loss, kl_penalty, value_loss
from rlinf_jax.algos import advantages as adv_lib
from rlinf_jax.config.schema import Config
from rlinf_jax.flow.optim import guarded_update
from rlinf_jax.policies.lm.logprobs import chunked, policy_logprobs, values_of
from rlinf_jax.policies.lm.lora import LoRA
from rlinf_jax.policies.lm.qlora import dequantize_state
from rlinf_jax.tasks.sft.lm_setup import policy_weights, trainable_value_and_grad, zero_grads


@struct.dataclass
class RLState:
    params: Any  # {"policy": nnx.State} (+ "lora", + "value": the value model for gae)
    opt_state: Any
    step: Count
    bad_iterations: Count


@dataclass(frozen=True)
class RLUpdate:
    """The static parts of the update: model graphs, optimiser, batch shape, and the
    numbers of ``cfg.algorithm`` the maths reads."""

    graphdef: Any
    value_graphdef: Any  # None without a value model
    lora: LoRA | None
    tx: optax.GradientTransformation
    schedule: Any
    algorithm: Any  # cfg.algorithm (read-only)
    temperature: float  # the sampler's; its log-probs are of the scaled distribution
    mini: int  # sequences per optimiser step
    micro: int  # sequences per forward/backward
    n_mini: int
    recompute_old: bool
    # Micro-batch rows split over the actor's batch axes (None: left to XLA).
    layout: Any = None
    # Multi-turn batches (agent.enabled): grpo_dynamic's "trajectory" or "turn" mode.
    turn_mode: str = "trajectory"
    # Rows per shared prompt in every micro-batch (1: each row runs its own prompt).
    prompt_group: int = 1
    # Vocabulary columns per chunk of the output head (actor.model.logits_chunk; 0: all).
    logits_chunk: int = 0

    @property
    def n_micro(self) -> int:
        return self.mini // self.micro

    @property
    def chunk_layout(self):
        """The layout of a whole-batch forward pass cut into micro-batches (``[chunks, micro,
        ...]``): each micro-batch's rows split as the update's are."""
        return None if self.layout is None else chunk_layout(self.layout.mesh, self.layout.spec[2])

    @classmethod
    def of(cls, cfg: Config, graphdef, value_graphdef, lora, tx, schedule, samples: int, layout) -> RLUpdate:
        a = cfg.algorithm
        mini, micro = cfg.actor.global_batch_size, cfg.actor.micro_batch_size
        n_mini = samples // mini
        t = cfg.rollout.temperature
        g = a.lm.group_size
        # Multi-turn rows carry observations after the prompt, and shuffled mini-batches
        # break the groups apart: those run every row's prompt.
        shared = g > 1 and not cfg.agent.enabled and n_mini == 1 and micro % g == 0
        return cls(
            graphdef=graphdef,
            value_graphdef=value_graphdef,
            lora=lora,
            tx=tx,
            schedule=schedule,
            algorithm=a,
            temperature=t if t > 0 else 1.0,
            mini=mini,
            micro=micro,
            n_mini=n_mini,
            # One epoch over one mini-batch is exactly on-policy: the old log-probs are the
            # current ones and need no forward pass of their own.
            recompute_old=a.update_epochs > 1 or n_mini > 1 or a.loss_type == "decoupled_ppo",
            layout=layout,
            turn_mode=cfg.agent.advantage_mode,
            prompt_group=g if shared else 1,
            logits_chunk=cfg.actor.model.logits_chunk,
        )


def chunk_layout(mesh, axes):
    """``[chunks, rows, ...]`` with the rows split over ``axes`` of ``mesh`` (see `chunked`)."""
    return NamedSharding(mesh, PartitionSpec(None, axes))


def reference_logprobs(graphdef, temperature: float, micro: int, group: int, ref_params, batch: dict,
                       logits_chunk: int = 0, layout=None):
    """Log-probs ``[S, N]`` of the responses under the reference model (a QLoRA run's
    reference is its base, kept in NF4 and dequantised here); ``layout``: see `chunked`."""
    model = nnx.merge(graphdef, dequantize_state(ref_params))
    return chunked(lambda mb: policy_logprobs(model, mb, temperature, group, logits_chunk)[0], batch, micro, layout)


def advantages(u: RLUpdate, params, batch: dict) -> dict:
    """Old log-probs and values (pre-update), advantages and returns, ``[S, N]``."""
    a = u.algorithm
    m = batch["response_mask"]
    out = {}
    if u.recompute_old:
        model = nnx.merge(u.graphdef, policy_weights(u.lora, params))
        fn = lambda mb: policy_logprobs(model, mb, u.temperature, u.prompt_group, u.logits_chunk)[0]  # noqa: E731
        out["old_logp"] = jax.lax.stop_gradient(chunked(fn, batch, u.micro, u.chunk_layout))
    rewards = batch["rewards"]
    kl_tokens = None
    if a.lm.kl_coef > 0 and a.lm.kl_in_reward:
        behaviour = out.get("old_logp", batch["sampler_logp"])
        kl_tokens = jnp.where(m > 0, kl_penalty(behaviour, batch["ref_logp"], a.lm.kl_type), 0.0)
    valid = m > 0
    if "turn_ids" in batch:
        # Multi-turn episodes: GRPO per episode or per turn, on the model's tokens only.
        turn_adv = adv_lib.grpo_dynamic(batch["turn_rewards"], batch["turn_valid"], a.lm.group_size, u.turn_mode)
        out["advantages"] = adv_lib.turn_token_advantages(turn_adv, batch["turn_ids"], m)
        return out
    last = (jnp.arange(m.shape[1])[None, :] == (jnp.sum(m, axis=1, dtype=jnp.int32) - 1)[:, None]) & valid
    if a.adv_type in GROUP_OUTCOME_ADVANTAGES:
        seq_rewards = rewards if kl_tokens is None else rewards - a.lm.kl_coef * jnp.sum(kl_tokens, axis=1)
        adv = get_advantage(a.adv_type)(seq_rewards, a.lm.group_size)
        out["advantages"] = jnp.where(valid, adv[:, None], 0.0)
        return out
    outcome = jnp.where(last, rewards[:, None], 0.0)
    penalty = None if kl_tokens is None else -a.lm.kl_coef * kl_tokens
    token_rewards = outcome if penalty is None else outcome + penalty
    if a.adv_type == "reinforce_pp":
        out["advantages"] = adv_lib.reinforce_pp(token_rewards, m, a.gamma)
    elif a.adv_type == "reinforce_pp_baseline":
        # The baseline is the group mean of the outcomes alone; the KL penalty comes after it.
        out["advantages"] = adv_lib.reinforce_pp_baseline(outcome, m, a.lm.group_size, a.gamma, token_penalty=penalty)
    else:  # gae on the value model
        vm = nnx.merge(u.value_graphdef, params["value"])
        values = jax.lax.stop_gradient(chunked(lambda mb: values_of(vm, mb), batch, u.micro, u.chunk_layout))
        values = jnp.where(valid, values, 0.0)
        adv, ret = adv_lib.gae(
            token_rewards.T, values.T, last.T.astype(jnp.float32), jnp.zeros(m.shape[0]), a.gamma, a.gae_lambda
        )
        adv, ret = jnp.where(valid, adv.T, 0.0), jnp.where(valid, ret.T, 0.0)
        if a.normalize_advantages:
            adv = adv_lib.whiten(adv, m)  # veRL's masked_whiten
        out.update(advantages=adv, old_values=values, returns=ret)
    return out


def micro_loss(u: RLUpdate, params, mb: dict, totals: dict):
    """The micro-batch's share of its mini-batch's loss, and token-weighted metrics."""
    a = u.algorithm
    m = mb["response_mask"]
    agg = a.lm.loss_agg
    if agg == "token-mean":
        w = jnp.sum(m) / jnp.maximum(totals["tokens"], 1.0)
    elif agg == "seq-mean-token-mean":
        w = jnp.sum(jnp.sum(m, axis=1) > 0) / jnp.maximum(totals["nonempty"], 1.0)
    else:
        w = m.shape[0] / totals["seqs"]
    share = jnp.sum(m) / jnp.maximum(totals["tokens"], 1.0)  # weight of this micro-batch's token metrics

    model = nnx.merge(u.graphdef, policy_weights(u.lora, params))
    logp, entropy = policy_logprobs(model, mb, u.temperature, u.prompt_group, u.logits_chunk)
    old = mb["old_logp"] if u.recompute_old else jax.lax.stop_gradient(logp)
    adv = mb["advantages"]
    dual = a.lm.dual_clip if a.lm.dual_clip > 0 else None
    if a.loss_type == "decoupled_ppo":
        pg, pgm = get_policy_loss(a.loss_type)(
            logp, old, mb["sampler_logp"], adv, m, a.lm.clip_low, a.lm.clip_high, dual_clip=dual, agg=agg
        )
    else:
        kw = {"dual_clip": dual} if a.loss_type == "ppo" or dual is not None else {}
        pg, pgm = get_policy_loss(a.loss_type)(logp, old, adv, m, a.lm.clip_low, a.lm.clip_high, agg=agg, **kw)
    loss = pg * w
    ent = aggregate(entropy, m)
    metrics = {
        "train/policy_loss": pg * w,
        "train/clip_fraction": pgm["clip_fraction"] * share,
        "train/approx_kl": pgm["approx_kl"] * share,
        "train/entropy": ent * share,
    }
    if a.entropy_coef:
        loss = loss - a.entropy_coef * aggregate(entropy, m, agg) * w
    if a.lm.kl_coef > 0:
        kl = kl_penalty(logp, mb["ref_logp"], a.lm.kl_type)
        metrics["train/kl"] = aggregate(kl, m) * share
        if not a.lm.kl_in_reward:
            loss = loss + a.lm.kl_coef * aggregate(kl, m, agg) * w
    if u.value_graphdef is not None:
        vm = nnx.merge(u.value_graphdef, params["value"])
        v = values_of(vm, mb)
        vl = value_loss(v, mb["old_values"], mb["returns"], m, a.lm.value_clip or None, agg=agg)
        loss = loss + a.value_coef * vl * w
        metrics["train/value_loss"] = vl * w
        metrics["train/value_mean"] = aggregate(v, m) * share
    return loss, metrics


def update(u: RLUpdate, ts: RLState, batch: dict, key):
    """Advantages, then ``update_epochs`` epochs of guarded steps over mini-batches."""
    a = u.algorithm
    pre = advantages(u, ts.params, batch)
    data = {**batch, **pre}
    m = data["response_mask"]
    S = m.shape[0]
    grad_fn = trainable_value_and_grad(lambda p, mb, totals: micro_loss(u, p, mb, totals), u.lora, has_aux=True)

    def mini_step(carry, mini):
        params, opt_state = carry
        mm = mini["response_mask"]
        totals = {
            "tokens": jnp.sum(mm).astype(jnp.float32),
            "nonempty": jnp.sum(jnp.sum(mm, axis=-1) > 0).astype(jnp.float32),
            "seqs": jnp.float32(u.mini),
        }

        def micro_step(grads, mb):
            (loss, metrics), g = grad_fn(params, mb, totals)
            return jax.tree.map(jnp.add, grads, g), {**metrics, "train/loss": loss}

        grads, metrics = jax.lax.scan(micro_step, zero_grads(u.lora, params), mini)
        metrics = {k: jnp.sum(v) for k, v in metrics.items()}  # shares of the mini-batch: summed
        params, opt_state, ok = guarded_update(u.tx, grads, params, opt_state, metrics["train/loss"])
        metrics = {k: jnp.where(ok, v, 0.0) for k, v in metrics.items()}
        metrics["train/grad_norm"] = jnp.where(ok, optax.tree.norm(grads), 0.0)
        metrics["train/ok_updates"] = ok.astype(jnp.float32)
        return (params, opt_state), metrics

    def epoch(carry, epoch_key):
        perm = jax.random.permutation(epoch_key, S) if u.n_mini > 1 else jnp.arange(S)
        shuffled = jax.tree.map(lambda x: x[perm].reshape(u.n_mini, u.n_micro, u.micro, *x.shape[1:]), data)
        if u.layout is not None:
            shuffled = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, u.layout), shuffled)
        return jax.lax.scan(mini_step, carry, shuffled)

    keys = jax.random.split(key, a.update_epochs)
    (params, opt_state), metrics = jax.lax.scan(epoch, (ts.params, ts.opt_state), keys)
    ok = metrics.pop("train/ok_updates")
    n_ok = jnp.sum(ok)
    out = {k: jnp.sum(v) / jnp.maximum(n_ok, 1.0) for k, v in metrics.items()}
    out["train/skipped_updates"] = ok.size - n_ok
    out["train/lr"] = jnp.asarray(u.schedule(ts.step * a.update_epochs * u.n_mini), jnp.float32)
    out["train/advantage_mean"] = aggregate(pre["advantages"], m)
    out["train/advantage_abs"] = aggregate(jnp.abs(pre["advantages"]), m)
    skipped = out["train/skipped_updates"] > 0
    new = ts.replace(
        params=params,
        opt_state=opt_state,
        step=ts.step + 1,
        bad_iterations=jnp.where(skipped, ts.bad_iterations + 1, 0),
    )
    return new, out

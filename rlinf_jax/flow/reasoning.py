"""Reasoning RL of a causal LM on verifiable rewards: GRPO, DAPO, REINFORCE++ and PPO.

One iteration, on the components of ``cluster.component_placement``:

    data (host) -> rollout.generate (rollout mesh, group_size samples per prompt)
      -> reward (host, checker processes) -> [dynamic sampling: more groups until full]
      -> reference log-probs (reference mesh, when algorithm.kl_coef > 0)
      -> advantages + PPO epochs over mini-batches of micro-batches (actor mesh)
      -> weight sync: actor parameters resharded onto the rollout's layout

Everything random is keyed by the iteration and the sample: rollout keys are
``fold_in(fold_in(seed key, iteration), round)`` with one stream per sample row, epochs
shuffle with ``fold_in(update key, iteration)``. So the same seed gives the same numbers
whatever the placement (collocated, disaggregated or hybrid, up to float reduction order)
and a resumed run continues exactly where the checkpoint left it.

In a multi-host job (one process per host) every process runs this flow on the whole
rollout batch: the prompts are the same everywhere, the sampled tokens are gathered to
every host, each process scores its share of the rows (`reasoning_rewards`), and arrays
move between component meshes on different hosts through `sharding.mesh.put`.

Advantages by ``algorithm.adv_type``: group estimators (grpo, dr_grpo, rloo) give one value
per response, spread over its tokens; reinforce_pp / reinforce_pp_baseline work on token
rewards (the outcome on the last token, minus ``kl_coef * KL`` per token with
``kl_in_reward``); gae runs a value model (a copy of the policy's trunk with a scalar head,
trained beside the policy with its own learning rate) with the reward on the last token.

A mini-batch's loss is the ``algorithm.loss_agg`` aggregate over all its tokens or
sequences: each micro-batch's aggregate is weighted by its share of the mini-batch's
tokens (token-mean) or sequences (seq-*), so gradient accumulation gives the gradient of
the whole mini-batch, whatever the micro-batch size. With one epoch and one mini-batch
the update is exactly on-policy and the old log-probs are the current ones (no extra
forward pass); otherwise they are recomputed with the pre-update parameters.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec

from rlinf_jax.algos import advantages as adv_lib
from rlinf_jax.algos import (
    aggregate,
    get_advantage,
    get_aggregation,
    get_kl,
    get_policy_loss,
    kl_penalty,
    value_loss,
)
from rlinf_jax.config.schema import Config
from rlinf_jax.data import PromptLoader, build_datasets
from rlinf_jax.errors import BadInput
from rlinf_jax.flow import reasoning_model as rm
from rlinf_jax.flow.dynamic_sampling import collect_informative_groups
from rlinf_jax.flow.reasoning_data import data_config, reward_config
from rlinf_jax.flow.reasoning_eval import score_dataset
from rlinf_jax.flow.reasoning_lora import LoRA
from rlinf_jax.flow.reasoning_rewards import SplitRewards
from rlinf_jax.rewards import RewardFunction
from rlinf_jax.rollout.sampler import SamplingParams
from rlinf_jax.sharding import (
    batch_axes,
    batch_divisor,
    component_mesh,
    param_shardings,
    resolve_num_devices,
    resolve_placement,
    rules_from_config,
)
from rlinf_jax.sharding.mesh import fetch, put, replicated

GROUP_ADVANTAGES = ("grpo", "dr_grpo", "rloo")
TOKEN_ADVANTAGES = ("reinforce_pp", "reinforce_pp_baseline")
POLICY_LOSSES = ("ppo", "dual_clip_ppo", "decoupled_ppo")


def components(cfg: Config) -> tuple[str, ...]:
    """The device components of a reasoning run (the reward runs on the host)."""
    return ("rollout", "reference", "actor") if cfg.algorithm.kl_coef > 0 else ("rollout", "actor")


def check_algorithm(cfg: Config) -> None:
    """Algorithm names against the registry, and what this flow can run."""
    a = cfg.algorithm
    get_advantage(a.adv_type)
    get_policy_loss(a.loss_type)
    get_aggregation(a.loss_agg)
    if a.kl_coef > 0:
        get_kl(a.kl_type)
    if a.adv_type not in (*GROUP_ADVANTAGES, *TOKEN_ADVANTAGES, "gae"):
        raise BadInput(
            f"algorithm.adv_type={a.adv_type!r} is registered but the reasoning flow does not know its inputs; "
            f"use one of {', '.join((*GROUP_ADVANTAGES, *TOKEN_ADVANTAGES, 'gae'))}"
        )
    if a.loss_type not in POLICY_LOSSES:
        raise BadInput(f"algorithm.loss_type={a.loss_type!r}: the reasoning flow runs {', '.join(POLICY_LOSSES)}")
    if a.dynamic_sampling and a.adv_type not in (*GROUP_ADVANTAGES, "reinforce_pp_baseline"):
        raise BadInput(
            "algorithm.dynamic_sampling keeps prompt groups whose rewards differ, which only matters to group "
            f"advantages (grpo, dr_grpo, rloo, reinforce_pp_baseline), not adv_type={a.adv_type}"
        )


@struct.dataclass
class RLState:
    params: Any  # {"policy": nnx.State} (+ "value": value model state for gae)
    opt_state: Any
    step: jax.Array
    bad_iterations: jax.Array


def _token_share(mask, total):
    return jnp.sum(mask) / jnp.maximum(total, 1.0)


def _labels(params: dict) -> dict:
    """Each top-level part of the parameters (policy, lora, value) labelled by its name."""
    return {k: jax.tree.map(lambda _, k=k: k, v) for k, v in params.items()}


class ReasoningTrainer:
    def __init__(self, cfg: Config, placement=None, devices=None):
        check_algorithm(cfg)
        self.cfg = cfg
        a = cfg.algorithm
        num_devices = resolve_num_devices(cfg.cluster.num_devices)
        devices = jax.devices()[:num_devices] if devices is None else devices
        if placement is None:
            placement = resolve_placement(cfg.cluster.component_placement, components(cfg), len(devices), cfg.cluster.mesh)
        self.placement = placement
        self.meshes = {c: component_mesh(placement, c, devices) for c in components(cfg)}
        self.rules = rules_from_config(cfg.cluster.partition_rules)

        # Data first: a bad file fails before any model is built.
        self.train_ds, self.eval_ds = build_datasets(data_config(cfg))
        self.num_prompts = cfg.data.rollout_batch_size
        self.group = a.group_size
        self.samples = self.num_prompts * self.group
        self.loader = PromptLoader(self.train_ds, self.num_prompts, cfg.data.seed, cfg.data.shuffle)

        loaded = rm.load_policy(cfg)
        self.model_source = loaded.source
        self.lm_config = loaded.model.config
        self.tokenizer = rm.load_run_tokenizer(cfg, self.lm_config.vocab_size)
        self.encoder = rm.PromptEncoder(cfg, self.tokenizer)
        self._meta_base = rm.checkpoint_meta(loaded.model, cfg.data.tokenizer)
        self.graphdef, policy = nnx.split(loaded.model)
        params = {"policy": policy}
        self.lora = None
        m = cfg.actor.model
        if m.lora_rank > 0:
            # The policy trains through adapters only; the base stays frozen.
            self.lora = LoRA(policy, m.lora_rank, m.lora_alpha)
            params["lora"] = self.lora.init(jax.random.PRNGKey(cfg.runner.seed + 1))
        self.use_value = a.adv_type == "gae"
        if self.use_value:
            # The critic starts as a copy of the policy's trunk with a zero head.
            trunk = nnx.merge(self.graphdef, jax.tree.map(jnp.copy, policy))
            value_model = rm.ValueModel(trunk, rngs=nnx.Rngs(cfg.runner.seed))
            self.value_graphdef, params["value"] = nnx.split(value_model)
        actor_mesh = self.meshes["actor"]
        self.param_shardings = param_shardings(params, actor_mesh, self.rules)
        self._init_params = put(params, self.param_shardings)
        self.reference = None
        if a.kl_coef > 0:
            ref_mesh = self.meshes["reference"]
            self.reference = put(policy, param_shardings(policy, ref_mesh, self.rules))
            self._ref_logprobs = jax.jit(self._reference_logprobs)

        self.mini = cfg.actor.global_batch_size
        self.micro = cfg.actor.micro_batch_size
        self.n_mini = self.samples // self.mini
        self.n_micro = self.mini // self.micro
        # One epoch over one mini-batch is exactly on-policy: the old log-probs are the
        # current ones and need no forward pass of their own.
        self.recompute_old = a.update_epochs > 1 or self.n_mini > 1 or a.loss_type == "decoupled_ppo"
        self.tx, self.schedule = self._make_optimizer()
        self._update = jax.jit(self._update_fn, donate_argnums=0, out_shardings=(self._state_shardings(), None))
        self._merged_policy = jax.jit(self.policy_state)

        self.reward_fn = SplitRewards(RewardFunction(reward_config(cfg)))
        ro = cfg.rollout
        self.sampler = rm.make_sampler(loaded.model, rm.pad_id(self.tokenizer), self.meshes["rollout"], self.rules)
        stops = rm.stop_tokens(self.tokenizer)
        self.sampling = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, ro.top_k, stops)
        self.eval_sampling = SamplingParams(ro.max_new_tokens, ro.eval_temperature, ro.top_p, ro.top_k, stops)
        self.samples_per_iteration = self.samples
        self.base_key = jax.random.PRNGKey(cfg.runner.seed)

    # ------------------------------------------------------------------ optimiser
    def _make_optimizer(self):
        cfg, o = self.cfg, self.cfg.actor.optim
        total = cfg.runner.max_steps * cfg.algorithm.update_epochs * self.n_mini
        tx, sched = rm.make_optimizer(o.lr, o.max_grad_norm, o.weight_decay, o.warmup_steps, o.lr_schedule, total)
        parts = {"policy": tx}
        if self.lora is not None:
            parts = {"policy": optax.set_to_zero(), "lora": tx}
        if self.use_value:
            parts["value"], _ = rm.make_optimizer(o.critic_lr, o.max_grad_norm, o.weight_decay, o.warmup_steps,
                                                  o.lr_schedule, total)
        return optax.multi_transform(parts, _labels), sched

    def policy_state(self, params):
        """The policy's weights: the parameters, or the frozen base merged with the adapters."""
        if self.lora is None:
            return params["policy"]
        return self.lora.merge(jax.lax.stop_gradient(params["policy"]), params["lora"])

    def rollout_weights(self, params):
        return params["policy"] if self.lora is None else self._merged_policy(params)

    # ------------------------------------------------------------------ state
    def _state_shardings(self):
        mesh = self.meshes["actor"]
        opt = jax.eval_shape(self.tx.init, self._init_params)
        return RLState(self.param_shardings, rm.state_shardings(opt, mesh, self.rules), replicated(mesh), replicated(mesh))

    def init(self) -> RLState:
        params = jax.tree.map(jnp.copy, self._init_params)
        opt_state = jax.jit(self.tx.init)(params)
        return self.start(RLState(params, opt_state, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32)))

    def start(self, ts: RLState) -> RLState:
        """Lays a (restored) state out on the actor mesh exactly as the update returns it,
        so the update compiles once."""
        mesh = self.meshes["actor"]
        ts = ts.replace(
            params=put(ts.params, self.param_shardings),
            opt_state=put(ts.opt_state, rm.state_shardings(ts.opt_state, mesh, self.rules)),
            step=put(ts.step, replicated(mesh)),
            bad_iterations=put(ts.bad_iterations, replicated(mesh)),
        )
        rm.sync_sampler(self.sampler, self.rollout_weights(ts.params))
        return ts

    def snapshot(self, ts: RLState) -> RLState:
        return ts

    def meta(self) -> dict:
        meta = {**self._meta_base, "loader": self.loader.state_dict(), "task": "reasoning"}
        if self.lora is not None:
            meta["lora"] = self.lora.meta()
        return meta

    def load_meta(self, meta: dict) -> None:
        if "loader" in meta:
            self.loader.load_state_dict(meta["loader"])

    def progress(self, ts: RLState) -> tuple[int, int]:
        step, bad = fetch((ts.step, ts.bad_iterations))
        return int(step), int(bad)

    def compile(self, ts: RLState) -> None:
        """Nothing ahead of time: stages compile on first use (per prompt bucket)."""

    def close(self) -> None:
        self.reward_fn.close()

    # ------------------------------------------------------------------ rollout (host + rollout mesh)
    def _rollout_round(self, key) -> dict:
        """One batch of prompts, ``group_size`` responses each, scored on the host."""
        b = next(self.loader)
        seqs = self.encoder.encode(b.prompts, b.ids)
        ids, mask = self.encoder.pad(seqs)
        ids, mask = np.repeat(ids, self.group, axis=0), np.repeat(mask, self.group, axis=0)
        t0 = time.perf_counter()
        out = self.sampler.generate(ids, mask, key, self.sampling, sample_ids=np.arange(self.samples, dtype=np.uint32))
        tokens, rmask, logp, lengths = (np.asarray(x) for x in fetch((out.tokens, out.mask, out.logprobs, out.lengths)))
        t1 = time.perf_counter()
        texts = rm.decode_responses(self.tokenizer, tokens, rmask)
        answers = [a for a in b.answers for _ in range(self.group)]
        result = self.reward_fn(texts, answers, lengths)
        t2 = time.perf_counter()
        stopped = np.isin(tokens, np.asarray(self.sampling.stop_tokens)) & rmask
        return {
            "prompts": [s for s in seqs for _ in range(self.group)],
            "tokens": tokens,
            "response_mask": rmask.astype(np.float32),
            "sampler_logp": logp.astype(np.float32),
            "lengths": lengths,
            "rewards": result.rewards.astype(np.float32),
            "correct": result.correct,
            "stopped": stopped.any(axis=1),
            "reward_metrics": result.metrics,
            "time": (t1 - t0, t2 - t1),
        }

    def _collect(self, key) -> tuple[dict, dict]:
        """The iteration's rollout batch (with DAPO's dynamic sampling when on) and its metrics."""
        a = self.cfg.algorithm
        rounds: list[dict] = []

        def sample_groups(rnd):
            data = self._rollout_round(jax.random.fold_in(key, rnd))
            rounds.append(data)
            ref = np.stack([np.full(self.num_prompts, rnd), np.arange(self.num_prompts)], axis=1)
            return {"ref": ref}, data["rewards"]

        extra = {}
        if a.dynamic_sampling:
            kept, report = collect_informative_groups(sample_groups, self.num_prompts, self.group, a.max_resample)
            rows = np.concatenate([np.arange(g * self.group, (g + 1) * self.group) for _, g in kept["ref"]])
            src = np.repeat(kept["ref"][:, 0], self.group)
            extra = report.metrics()
        else:
            sample_groups(0)
            rows, src = np.arange(self.samples), np.zeros(self.samples, np.int64)

        def pick(name):
            return np.stack([rounds[r][name][i] for r, i in zip(src, rows)])

        prompts = [rounds[r]["prompts"][i] for r, i in zip(src, rows)]
        prompt_ids, prompt_mask = self.encoder.pad(prompts)
        batch = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            **{k: pick(k) for k in ("tokens", "response_mask", "sampler_logp", "rewards")},
        }
        # The update runs on the columns some response reaches (rounded up to a bucket, so
        # it compiles for a few widths only), not on all max_new_tokens.
        width = min(rm.bucket(int(batch["response_mask"].sum(axis=1).max()), 16), batch["tokens"].shape[1])
        for k in ("tokens", "response_mask", "sampler_logp"):
            batch[k] = batch[k][:, :width]
        first = rounds[0]  # what the current policy does, before any filtering
        N = self.sampling.max_new_tokens
        metrics = {
            **first["reward_metrics"],
            "rollout/reward_mean": float(first["rewards"].mean()),
            "rollout/accuracy": float(first["correct"].mean()),
            "rollout/response_length": float(first["lengths"].mean()),
            "rollout/response_length_max": float(first["lengths"].max()),
            "rollout/clip_rate": float((first["lengths"] >= N).mean()),
            "rollout/truncation_rate": float((~first["stopped"]).mean()),
            "time/rollout_sec": float(sum(r["time"][0] for r in rounds)),
            "time/reward_sec": float(sum(r["time"][1] for r in rounds)),
            "rollout/tokens_per_sec": float(sum(r["lengths"].sum() for r in rounds) / max(sum(r["time"][0] for r in rounds), 1e-9)),
            **extra,
        }
        return batch, metrics

    # ------------------------------------------------------------------ reference (reference mesh)
    def _reference_logprobs(self, ref_params, batch):
        model = nnx.merge(self.graphdef, ref_params)
        fn = lambda mb: rm.policy_logprobs(model, mb, self._temperature())[0]
        return rm.chunked(fn, batch, self.micro)

    def _temperature(self) -> float:
        t = self.cfg.rollout.temperature
        return t if t > 0 else 1.0

    # ------------------------------------------------------------------ actor (actor mesh)
    def _advantages(self, params, batch):
        """Old log-probs and values (pre-update), advantages and returns, ``[S, N]``."""
        a = self.cfg.algorithm
        m = batch["response_mask"]
        out = {}
        if self.recompute_old:
            model = nnx.merge(self.graphdef, self.policy_state(params))
            fn = lambda mb: rm.policy_logprobs(model, mb, self._temperature())[0]
            out["old_logp"] = jax.lax.stop_gradient(rm.chunked(fn, batch, self.micro))
        rewards = batch["rewards"]
        kl_tokens = None
        if a.kl_coef > 0 and a.kl_in_reward:
            behaviour = out.get("old_logp", batch["sampler_logp"])
            kl_tokens = jnp.where(m > 0, kl_penalty(behaviour, batch["ref_logp"], a.kl_type), 0.0)
        valid = m > 0
        last = (jnp.arange(m.shape[1])[None, :] == (jnp.sum(m, axis=1, dtype=jnp.int32) - 1)[:, None]) & valid
        if a.adv_type in GROUP_ADVANTAGES:
            seq_rewards = rewards if kl_tokens is None else rewards - a.kl_coef * jnp.sum(kl_tokens, axis=1)
            adv = get_advantage(a.adv_type)(seq_rewards, self.group)
            out["advantages"] = jnp.where(valid, adv[:, None], 0.0)
            return out
        token_rewards = jnp.where(last, rewards[:, None], 0.0)
        if kl_tokens is not None:
            token_rewards = token_rewards - a.kl_coef * kl_tokens
        if a.adv_type == "reinforce_pp":
            out["advantages"] = adv_lib.reinforce_pp(token_rewards, m, a.gamma)
        elif a.adv_type == "reinforce_pp_baseline":
            out["advantages"] = adv_lib.reinforce_pp_baseline(token_rewards, m, self.group, a.gamma)
        else:  # gae on the value model
            vm = nnx.merge(self.value_graphdef, params["value"])
            values = jax.lax.stop_gradient(rm.chunked(lambda mb: rm.values_of(vm, mb), batch, self.micro))
            values = jnp.where(valid, values, 0.0)
            adv, ret = adv_lib.gae(
                token_rewards.T, values.T, last.T.astype(jnp.float32), jnp.zeros(m.shape[0]), a.gamma, a.gae_lambda
            )
            adv, ret = jnp.where(valid, adv.T, 0.0), jnp.where(valid, ret.T, 0.0)
            if a.normalize_advantages:
                adv = adv_lib._whiten(adv, m, 1e-8)
            out.update(advantages=adv, old_values=values, returns=ret)
        return out

    def _loss(self, params, mb, totals):
        """The micro-batch's share of its mini-batch's loss, and token-weighted metrics."""
        a = self.cfg.algorithm
        m = mb["response_mask"]
        agg = a.loss_agg
        if agg == "token-mean":
            w = jnp.sum(m) / jnp.maximum(totals["tokens"], 1.0)
        elif agg == "seq-mean-token-mean":
            w = jnp.sum(jnp.sum(m, axis=1) > 0) / jnp.maximum(totals["nonempty"], 1.0)
        else:
            w = m.shape[0] / totals["seqs"]
        share = _token_share(m, totals["tokens"])  # weight of this micro-batch's token metrics

        model = nnx.merge(self.graphdef, self.policy_state(params))
        logp, entropy = rm.policy_logprobs(model, mb, self._temperature())
        old = mb["old_logp"] if self.recompute_old else jax.lax.stop_gradient(logp)
        adv = mb["advantages"]
        dual = a.dual_clip if a.dual_clip > 0 else None
        if a.loss_type == "decoupled_ppo":
            pg, pgm = get_policy_loss(a.loss_type)(
                logp, old, mb["sampler_logp"], adv, m, a.clip_low, a.clip_high, dual_clip=dual, agg=agg
            )
        else:
            kw = {"dual_clip": dual} if a.loss_type == "ppo" or dual is not None else {}
            pg, pgm = get_policy_loss(a.loss_type)(logp, old, adv, m, a.clip_low, a.clip_high, agg=agg, **kw)
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
        if a.kl_coef > 0:
            kl = kl_penalty(logp, mb["ref_logp"], a.kl_type)
            metrics["train/kl"] = aggregate(kl, m) * share
            if not a.kl_in_reward:
                loss = loss + a.kl_coef * aggregate(kl, m, agg) * w
        if self.use_value:
            vm = nnx.merge(self.value_graphdef, params["value"])
            v = rm.values_of(vm, mb)
            vl = value_loss(v, mb["old_values"], mb["returns"], m, a.value_clip or None, agg=agg)
            loss = loss + a.value_coef * vl * w
            metrics["train/value_loss"] = vl * w
            metrics["train/value_mean"] = aggregate(v, m) * share
        return loss, metrics

    def _update_fn(self, ts: RLState, batch: dict, key):
        a = self.cfg.algorithm
        pre = self._advantages(ts.params, batch)
        data = {**batch, **pre}
        m = data["response_mask"]
        S = m.shape[0]
        mesh = self.meshes["actor"]
        # Micro-batch rows split over the actor's batch axes (data parallel) where they divide.
        layout = None
        if self.micro % batch_divisor(mesh) == 0 and batch_axes(mesh):
            layout = NamedSharding(mesh, PartitionSpec(None, None, batch_axes(mesh)))
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)

        def mini_step(carry, mini):
            params, opt_state = carry
            mm = mini["response_mask"]
            totals = {
                "tokens": jnp.sum(mm).astype(jnp.float32),
                "nonempty": jnp.sum(jnp.sum(mm, axis=-1) > 0).astype(jnp.float32),
                "seqs": jnp.float32(self.mini),
            }

            def micro_step(grads, mb):
                (loss, metrics), g = grad_fn(params, mb, totals)
                return jax.tree.map(jnp.add, grads, g), {**metrics, "train/loss": loss}

            grads, metrics = jax.lax.scan(micro_step, jax.tree.map(jnp.zeros_like, params), mini)
            metrics = {k: jnp.sum(v) for k, v in metrics.items()}  # shares of the mini-batch: summed
            updates, new_opt = self.tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            ok = jnp.isfinite(metrics["train/loss"]) & rm.finite(grads)
            metrics = {k: jnp.where(ok, v, 0.0) for k, v in metrics.items()}
            metrics["train/grad_norm"] = jnp.where(ok, optax.tree.norm(grads), 0.0)
            metrics["train/ok_updates"] = ok.astype(jnp.float32)
            return (rm.select(ok, new_params, params), rm.select(ok, new_opt, opt_state)), metrics

        def epoch(carry, epoch_key):
            perm = jax.random.permutation(epoch_key, S) if self.n_mini > 1 else jnp.arange(S)
            shuffled = jax.tree.map(lambda x: x[perm].reshape(self.n_mini, self.n_micro, self.micro, *x.shape[1:]), data)
            if layout is not None:
                shuffled = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, layout), shuffled)
            return jax.lax.scan(mini_step, carry, shuffled)

        keys = jax.random.split(key, a.update_epochs)
        (params, opt_state), metrics = jax.lax.scan(epoch, (ts.params, ts.opt_state), keys)
        ok = metrics.pop("train/ok_updates")
        n_ok = jnp.sum(ok)
        out = {k: jnp.sum(v) / jnp.maximum(n_ok, 1.0) for k, v in metrics.items()}
        out["train/skipped_updates"] = ok.size - n_ok
        out["train/lr"] = jnp.asarray(self.schedule(ts.step * a.update_epochs * self.n_mini), jnp.float32)
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

    # ------------------------------------------------------------------ iterations
    def iteration(self, ts: RLState, step: int):
        """One RL iteration; ``step`` is the iteration's index (its keys derive from it)."""
        t0 = time.perf_counter()
        key = jax.random.fold_in(self.base_key, step)
        rollout_key, update_key = jax.random.split(key)
        batch, metrics = self._collect(rollout_key)
        actor_mesh = self.meshes["actor"]
        device_batch = rm.place_rows(batch, actor_mesh, self.samples)
        if self.reference is not None:
            ref_mesh = self.meshes["reference"]
            ref_batch = rm.place_rows({k: batch[k] for k in ("prompt_ids", "prompt_mask", "tokens", "response_mask")},
                                      ref_mesh, self.samples)
            ref_logp = self._ref_logprobs(self.reference, ref_batch)
            device_batch["ref_logp"] = rm.place_rows({"x": ref_logp}, actor_mesh, self.samples)["x"]
        t1 = time.perf_counter()
        ts, train_metrics = self._update(ts, device_batch, update_key)
        train_metrics = {k: float(v) for k, v in fetch(train_metrics).items()}
        t2 = time.perf_counter()
        # Weight sync: the rollout's copy of the policy, laid out on the rollout mesh.
        rm.sync_sampler(self.sampler, self.rollout_weights(ts.params))
        t3 = time.perf_counter()
        metrics.update(train_metrics)
        metrics.update({"time/update_sec": t2 - t1, "time/sync_sec": t3 - t2, "time/step_sec": t3 - t0})
        return ts, metrics

    def run_iterations(self, ts: RLState, n: int):
        step = self.progress(ts)[0]
        sums: dict[str, float] = {}
        for i in range(n):
            ts, metrics = self.iteration(ts, step + i)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        out = {k: v / n for k, v in sums.items()}
        for k in ("train/skipped_updates", "reward/errors", "reward/timeouts"):
            if k in sums:
                out[k] = sums[k]
        return ts, out

    # ------------------------------------------------------------------ eval
    def run_eval(self, ts: RLState, key, progress=None) -> dict:
        if self.eval_ds is None:
            return {}
        rm.sync_sampler(self.sampler, self.rollout_weights(ts.params))
        result = score_dataset(
            self.sampler, self.encoder, self.reward_fn, self.eval_ds, self.eval_sampling, key,
            self.cfg.rollout.eval_batch_size, progress=progress,
        )
        return {f"eval/{k}": v for k, v in result.items() if k != "pass@1"}

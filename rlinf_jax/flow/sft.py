"""Supervised fine-tuning of a causal LM on prompt -> ``\\boxed{answer}`` targets.

The warm start of reasoning RL (a random model earns no reward, so RL has nothing to
reinforce) and a task of its own (``runner.task=sft``). One optimiser step takes
``actor.global_batch_size`` examples, cut into micro-batches of ``actor.micro_batch_size``
whose gradients are summed inside the jitted step (gradient accumulation); the loss is the
token mean of the targets' negative log-likelihood over the whole step's batch, so the
result does not depend on the micro-batch size. Prompt tokens carry no loss.

The trainer offers the small interface the host loop (`reasoning_runner`) drives:
init / start / snapshot / meta / load_meta / progress / compile / run_iterations /
run_eval.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from rlinf_jax.config.schema import Config
from rlinf_jax.data import PromptLoader, boxed_response, build_datasets
from rlinf_jax.flow import reasoning_model as rm
from rlinf_jax.flow.reasoning_data import data_config, reward_config
from rlinf_jax.flow.reasoning_eval import score_dataset
from rlinf_jax.flow.reasoning_lora import LoRA
from rlinf_jax.flow.reasoning_rewards import SplitRewards
from rlinf_jax.rewards import RewardFunction
from rlinf_jax.rollout.sampler import SamplingParams
from rlinf_jax.sharding import (
    component_mesh,
    param_shardings,
    resolve_num_devices,
    resolve_placement,
    rules_from_config,
)
from rlinf_jax.sharding.mesh import fetch, put, replicated

SFT_COMPONENTS = ("actor",)


@struct.dataclass
class LMTrainState:
    params: Any  # {"policy": nnx.State} (+ "lora": adapters, the policy then frozen)
    opt_state: Any
    step: jax.Array
    # Consecutive steps skipped for a non-finite loss or gradient.
    bad_iterations: jax.Array


def _labels(params: dict) -> dict:
    """Each top-level part of the parameters (policy, lora, value) labelled by its name."""
    return {k: jax.tree.map(lambda _, k=k: k, v) for k, v in params.items()}


class SFTTrainer:
    def __init__(self, cfg: Config, placement=None, devices=None):
        self.cfg = cfg
        num_devices = resolve_num_devices(cfg.cluster.num_devices)
        devices = jax.devices()[:num_devices] if devices is None else devices
        if placement is None:
            placement = resolve_placement(cfg.cluster.component_placement, SFT_COMPONENTS, len(devices), cfg.cluster.mesh)
        self.placement = placement
        self.mesh = component_mesh(placement, "actor", devices)
        self.rules = rules_from_config(cfg.cluster.partition_rules)

        # Data first: a bad file should fail before any model is built.
        self.train_ds, self.eval_ds = build_datasets(data_config(cfg))
        self.loader = PromptLoader(self.train_ds, cfg.actor.global_batch_size, cfg.data.seed, cfg.data.shuffle)

        loaded = rm.load_policy(cfg)
        self.model_source = loaded.source
        self.lm_config = loaded.model.config
        self.tokenizer = rm.load_run_tokenizer(cfg, self.lm_config.vocab_size)
        self.encoder = rm.PromptEncoder(cfg, self.tokenizer)
        self.graphdef, policy = nnx.split(loaded.model)
        self._meta_base = rm.checkpoint_meta(loaded.model, cfg.data.tokenizer)
        params = {"policy": policy}
        self.lora = None
        m = cfg.actor.model
        if m.lora_rank > 0:
            self.lora = LoRA(policy, m.lora_rank, m.lora_alpha)
            params["lora"] = self.lora.init(jax.random.PRNGKey(cfg.runner.seed + 1))
            self._meta_base["lora"] = self.lora.meta()
        self.param_shardings = param_shardings(params, self.mesh, self.rules)
        self._init_params = put(params, self.param_shardings)
        o = cfg.actor.optim
        tx, self.schedule = rm.make_optimizer(
            o.lr, o.max_grad_norm, o.weight_decay, o.warmup_steps, o.lr_schedule, cfg.runner.max_steps
        )
        parts = {"policy": tx} if self.lora is None else {"policy": optax.set_to_zero(), "lora": tx}
        self.tx = optax.multi_transform(parts, _labels)
        self._merged_policy = jax.jit(self.policy_state)
        self.reward_fn = SplitRewards(RewardFunction(reward_config(cfg)))
        self.sampler = rm.make_sampler(loaded.model, rm.pad_id(self.tokenizer), self.mesh, self.rules)
        self.eval_sampling = SamplingParams(
            cfg.rollout.max_new_tokens, cfg.rollout.eval_temperature, stop_tokens=rm.stop_tokens(self.tokenizer)
        )
        self.batch_size = cfg.actor.global_batch_size
        self.micro = cfg.actor.micro_batch_size
        self._step = jax.jit(self._train_step, donate_argnums=0, out_shardings=(self._state_shardings(), None))
        self.samples_per_iteration = self.batch_size

    # ------------------------------------------------------------------ state
    def policy_state(self, params):
        """The policy's weights: the parameters, or the frozen base merged with the adapters."""
        if self.lora is None:
            return params["policy"]
        return self.lora.merge(jax.lax.stop_gradient(params["policy"]), params["lora"])

    def _state_shardings(self):
        opt = jax.eval_shape(self.tx.init, self._init_params)
        rep = replicated(self.mesh)
        return LMTrainState(self.param_shardings, rm.state_shardings(opt, self.mesh, self.rules), rep, rep)

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

    def snapshot(self, ts: LMTrainState) -> LMTrainState:
        return ts

    def meta(self) -> dict:
        return {**self._meta_base, "loader": self.loader.state_dict(), "task": "sft"}

    def load_meta(self, meta: dict) -> None:
        if "loader" in meta:
            self.loader.load_state_dict(meta["loader"])

    def progress(self, ts: LMTrainState) -> tuple[int, int]:
        step, bad = fetch((ts.step, ts.bad_iterations))
        return int(step), int(bad)

    # ------------------------------------------------------------------ step
    def _train_step(self, ts: LMTrainState, batch: dict):
        B = batch["tokens"].shape[0]
        n_micro = B // self.micro
        total = jnp.maximum(jnp.sum(batch["response_mask"]), 1).astype(jnp.float32)
        micro = jax.tree.map(lambda x: x.reshape(n_micro, self.micro, *x.shape[1:]), batch)

        def loss_fn(params, mb):
            model = nnx.merge(self.graphdef, self.policy_state(params))
            logp, _ = rm.policy_logprobs(model, mb)
            m = mb["response_mask"] > 0
            return -jnp.sum(jnp.where(m, logp, 0.0)) / total

        def accumulate(grads, mb):
            loss, g = jax.value_and_grad(loss_fn)(ts.params, mb)
            return jax.tree.map(jnp.add, grads, g), loss

        zeros = jax.tree.map(jnp.zeros_like, ts.params)
        grads, losses = jax.lax.scan(accumulate, zeros, micro)
        loss = jnp.sum(losses)
        updates, opt_state = self.tx.update(grads, ts.opt_state, ts.params)
        params = optax.apply_updates(ts.params, updates)
        ok = jnp.isfinite(loss) & rm.finite(grads)
        # A non-finite loss or gradient never reaches the parameters.
        new = ts.replace(
            params=rm.select(ok, params, ts.params),
            opt_state=rm.select(ok, opt_state, ts.opt_state),
            step=ts.step + 1,
            bad_iterations=jnp.where(ok, 0, ts.bad_iterations + 1),
        )
        metrics = {
            "train/loss": jnp.where(ok, loss, 0.0),
            "train/grad_norm": jnp.where(ok, optax.tree.norm(grads), 0.0),
            "train/lr": jnp.asarray(self.schedule(ts.step), jnp.float32),
            "train/target_tokens": total,
            "train/skipped_updates": (~ok).astype(jnp.float32),
        }
        return new, metrics

    def next_batch(self) -> dict:
        b = next(self.loader)
        prompt_ids, prompt_mask = self.encoder(b.prompts, b.ids)
        tokens, mask = rm.encode_targets(self.tokenizer, [boxed_response(a) for a in b.answers], self.cfg.rollout.max_new_tokens)
        batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "tokens": tokens, "response_mask": mask}
        return rm.place_rows(batch, self.mesh, self.micro)

    def compile(self, ts: LMTrainState) -> None:
        """Nothing ahead of time: the step compiles on first use (per prompt bucket)."""

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
        if self.eval_ds is None:
            return {}
        rm.sync_sampler(self.sampler, ts.params["policy"] if self.lora is None else self._merged_policy(ts.params))
        result = score_dataset(
            self.sampler, self.encoder, self.reward_fn, self.eval_ds, self.eval_sampling, key,
            self.cfg.rollout.eval_batch_size, progress=progress,
        )
        return {f"eval/{k}": v for k, v in result.items() if k != "pass@1"}

    def close(self) -> None:
        self.reward_fn.close()

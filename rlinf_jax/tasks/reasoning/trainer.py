"""Reasoning RL of a causal LM on verifiable rewards: GRPO, DAPO, REINFORCE++ and PPO.

One iteration, on the components of ``cluster.component_placement``:

    data (host) -> rollout.generate (rollout mesh, group_size samples per prompt)
      -> reward (host, checker processes) -> [dynamic sampling: more groups until full]
      -> reference log-probs (reference mesh, when algorithm.lm.kl_coef > 0)
      -> advantages + PPO epochs over mini-batches of micro-batches (actor mesh)
      -> weight sync: actor parameters resharded onto the rollout's layout

Everything random is keyed by the iteration and the sample: rollout keys are
``fold_in(fold_in(seed key, iteration), round)`` with one stream per sample row, epochs
shuffle with ``fold_in(update key, iteration)``. So the same seed gives the same numbers
whatever the placement (collocated, disaggregated or hybrid, up to float reduction order)
and a resumed run continues exactly where the checkpoint left it.

In a multi-host job (one process per host) every process runs this flow on the whole
rollout batch: the prompts are the same everywhere, the sampled tokens are gathered to
every host, each process scores its share of the rows (`rlinf_jax.rewards.split`), and
arrays move between component meshes on different hosts through `sharding.mesh.put`.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rlinf_jax.agents.factory import env_factory, tool_executor
from rlinf_jax.config.schema import Config
from rlinf_jax.data import PromptLoader
from rlinf_jax.flow.optim import clipped_adamw
from rlinf_jax.policies.lm.qlora import dequantize_state
from rlinf_jax.policies.lm.value import ValueModel
from rlinf_jax.rollout.lm_io import sync_sampler
from rlinf_jax.rollout.multi_turn import MultiTurnRollout
from rlinf_jax.rollout.sampler import SamplingParams
from rlinf_jax.sharding import (
    batch_axes,
    batch_divisor,
    component_mesh,
    param_shardings,
    place_rows,
    reshard,
    resolve_num_devices,
    rules_from_config,
    state_shardings,
)
from rlinf_jax.sharding.mesh import fetch, put, replicated
from rlinf_jax.tasks.reasoning import update as rl
from rlinf_jax.tasks.reasoning.agent_collect import AgentCollector
from rlinf_jax.tasks.reasoning.collect import Collector
from rlinf_jax.tasks.reasoning.config import check_algorithm, components
from rlinf_jax.tasks.reasoning.config import placement as place
from rlinf_jax.tasks.reasoning.update import RLState
from rlinf_jax.tasks.sft.lm_setup import LMTrainer, lm_transform, make_lm_setup, policy_weights


class ReasoningTrainer(LMTrainer):
    task = "reasoning"

    def __init__(self, cfg: Config, placement=None, devices=None):
        check_algorithm(cfg)
        self.cfg = cfg
        a = cfg.algorithm
        num_devices = resolve_num_devices(cfg.cluster.num_devices)
        devices = jax.devices()[:num_devices] if devices is None else devices
        if placement is None:
            placement = place(cfg, len(devices))
        self.placement = placement
        self.meshes = {c: component_mesh(placement, c, devices) for c in components(cfg)}
        # Where the update runs: the actor's mesh, or with cluster.scaling=dynamic the
        # update phase's (the actor's devices plus the rollout's). The state lives on the
        # actor's mesh between updates and moves there and back (`_switch`).
        self.dynamic = "update" in placement.phases
        self.update_mesh = component_mesh(placement, "update", devices) if self.dynamic else self.meshes["actor"]
        self.rules = rules_from_config(cfg.cluster.partition_rules)

        lm = self.lm = make_lm_setup(cfg, self.meshes["rollout"], self.rules, len(devices))
        self.model_source, self.lm_config, self.tokenizer, self.lora = lm.model_source, lm.lm_config, lm.tokenizer, lm.lora
        self.num_prompts, self.group = cfg.data.rollout_batch_size, a.lm.group_size
        self.samples = self.samples_per_iteration = self.num_prompts * self.group
        self.loader = PromptLoader(lm.train_ds, self.num_prompts, cfg.data.seed, cfg.data.shuffle)
        params = dict(lm.params)
        value_graphdef = None
        if a.adv_type == "gae":
            # The critic starts as a copy of the policy's trunk with a zero head (a QLoRA
            # base dequantised: the critic trains whole).
            trunk = nnx.merge(lm.graphdef, jax.tree.map(jnp.copy, dequantize_state(params["policy"])))
            value_graphdef, params["value"] = nnx.split(ValueModel(trunk, rngs=nnx.Rngs(cfg.runner.seed)))
        actor_mesh, update_mesh = self.meshes["actor"], self.update_mesh
        self.param_shardings = param_shardings(params, actor_mesh, self.rules)
        self._init_params = put(params, self.param_shardings)
        self.reference = None
        self.micro = cfg.actor.micro_batch_size
        if a.lm.kl_coef > 0:
            policy = params["policy"]
            self.reference = put(policy, param_shardings(policy, self.meshes["reference"], self.rules))

        n_mini = self.samples // cfg.actor.global_batch_size
        self.tx, schedule = self._make_optimizer(n_mini, value=value_graphdef is not None)
        layout = None
        if self.micro % batch_divisor(update_mesh) == 0 and batch_axes(update_mesh):
            # Micro-batch rows split over the update's batch axes (data parallel) where they divide.
            layout = NamedSharding(update_mesh, PartitionSpec(None, None, batch_axes(update_mesh)))
        u = self.update_spec = rl.RLUpdate.of(cfg, lm.graphdef, value_graphdef, self.lora, self.tx, schedule, self.samples, layout)
        # The train state's layouts: at home on the actor's mesh, and during the update.
        self._layouts = {"actor": self._state_shardings(actor_mesh), "update": self._state_shardings(update_mesh)}
        self._update = jax.jit(functools.partial(rl.update, u), donate_argnums=0,
                               out_shardings=(self._layouts["update"], None))
        ref_layout = None
        if self.reference is not None:
            ref_mesh = self.meshes["reference"]
            if self.micro % batch_divisor(ref_mesh) == 0 and batch_axes(ref_mesh):
                ref_layout = rl.chunk_layout(ref_mesh, batch_axes(ref_mesh))
        self._ref_logprobs = jax.jit(functools.partial(rl.reference_logprobs, lm.graphdef, u.temperature, self.micro,
                                                      u.prompt_group, logits_chunk=u.logits_chunk, layout=ref_layout))
        self._merged_policy = jax.jit(functools.partial(policy_weights, self.lora))

        ro = cfg.rollout
        self.sampler = lm.sampler
        self.sampling = SamplingParams(ro.max_new_tokens, ro.temperature, ro.top_p, ro.top_k, lm.stop_tokens)
        self.eval_sampling = lm.eval_sampling(cfg)
        self.collector = Collector(
            lm.sampler, lm.encoder, lm.tokenizer, lm.reward_fn, self.loader, self.sampling, self.num_prompts,
            self.group, a.lm.dynamic_sampling, a.lm.max_resample,
        )
        self.executor = None
        if cfg.agent.enabled:
            ag = cfg.agent
            self.executor = tool_executor(ag)
            limits = ag.limits()
            self.collector = AgentCollector(
                MultiTurnRollout(lm.sampler, lm.tokenizer, limits), lm.encoder, env_factory(ag, self.executor),
                cfg.reward, self.loader, self.num_prompts, self.group, ro.temperature, ro.top_p, ro.top_k,
            )
        self.base_key = jax.random.PRNGKey(cfg.runner.seed)

    def _make_optimizer(self, n_mini: int, value: bool):
        cfg, o = self.cfg, self.cfg.actor.optim
        total = cfg.runner.max_steps * cfg.algorithm.update_epochs * n_mini
        tx, sched = clipped_adamw(o.lr, o.max_grad_norm, o.weight_decay, o.warmup_steps, o.lr_schedule, total)
        others = {}
        if value:
            others["value"], _ = clipped_adamw(o.critic_lr, o.max_grad_norm, o.weight_decay, o.warmup_steps,
                                               o.lr_schedule, total)
        return lm_transform(tx, self.lora, **others), sched

    def rollout_weights(self, params):
        return params["policy"] if self.lora is None else self._merged_policy(params)

    # ------------------------------------------------------------------ state
    def _state_shardings(self, mesh):
        opt = jax.eval_shape(self.tx.init, self._init_params)
        params = param_shardings(self._init_params, mesh, self.rules)
        return RLState(params, state_shardings(opt, mesh, self.rules), replicated(mesh), replicated(mesh))

    def _switch(self, ts: RLState, to: str) -> tuple[RLState, float]:
        """cluster.scaling=dynamic: the train state onto the update phase's layout or back
        home to the actor's (``to``), each source buffer freed as its copy lands so that no
        two whole copies are held; returns it and the seconds the move took."""
        t0 = time.perf_counter()
        ts = jax.block_until_ready(reshard(ts, self._layouts[to], donate=True))
        return ts, time.perf_counter() - t0

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
            opt_state=put(ts.opt_state, state_shardings(ts.opt_state, mesh, self.rules)),
            step=put(ts.step, replicated(mesh)),
            bad_iterations=put(ts.bad_iterations, replicated(mesh)),
        )
        sync_sampler(self.sampler, self.rollout_weights(ts.params))
        return ts

    # ------------------------------------------------------------------ iterations
    def iteration(self, ts: RLState, step: int):
        """One RL iteration; ``step`` is the iteration's index (its keys derive from it)."""
        t0 = time.perf_counter()
        key = jax.random.fold_in(self.base_key, step)
        rollout_key, update_key = jax.random.split(key)
        batch, metrics = self.collector.batch(rollout_key)
        update_mesh = self.update_mesh
        device_batch = place_rows(batch, update_mesh, self.samples)
        if self.reference is not None:
            ref_rows = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "tokens", "response_mask", "response_valid")
                        if k in batch}
            ref_logp = self._ref_logprobs(self.reference, place_rows(ref_rows, self.meshes["reference"], self.samples))
            device_batch["ref_logp"] = place_rows({"x": ref_logp}, update_mesh, self.samples)["x"]
        t1 = time.perf_counter()
        # The rollout's copy of the weights is stale from here on and rebuilt by the sync
        # below: released, so that on shared chips (and, scaling dynamically, on the
        # rollout's devices that the update borrows) the update has its memory.
        self.sampler.release_params()
        switch = 0.0
        if self.dynamic:
            ts, switch = self._switch(ts, "update")
        ts, train_metrics = self._update(ts, device_batch, update_key)
        train_metrics = {k: float(v) for k, v in fetch(train_metrics).items()}
        if self.dynamic:
            ts, back = self._switch(ts, "actor")
            switch += back
            train_metrics["time/switch_s"] = switch
        t2 = time.perf_counter()
        # Weight sync: the rollout's copy of the policy, laid out on the rollout mesh.
        sync_sampler(self.sampler, self.rollout_weights(ts.params))
        t3 = time.perf_counter()
        metrics.update(train_metrics)
        # The update's own time; the state's moves around it are time/switch_s.
        metrics.update({"time/update_sec": t2 - t1 - switch, "time/sync_sec": t3 - t2, "time/step_sec": t3 - t0})
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
        if self.lm.eval_ds is None:
            return {}
        sync_sampler(self.sampler, self.rollout_weights(ts.params))
        if self.cfg.agent.enabled:
            ro = self.cfg.rollout
            return self.collector.evaluate(self.lm.eval_ds, key, ro.eval_batch_size, ro.eval_temperature)
        return self.score_heldout(self.sampler, self.eval_sampling, key, progress)

    def close(self):
        if self.executor is not None:
            self.executor.close()
        super().close()

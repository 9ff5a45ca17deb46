"""A language model's sft run as programs for the planner (`rlinf_jax.flow.plan`): its one
program, the optimiser step the trainer jits (`tasks.sft.lm.train_step`: the micro-batches'
forward and backward, then a guarded AdamW step), given abstract arguments laid out as the
trainer lays out its own on the actor's mesh over the target's devices. No weights are read
and no data: shapes come from the architecture (`lm_model.lm_architecture`) and the config's
sizes, at their largest (every prompt at ``data.max_prompt_length``, every target
``rollout.max_new_tokens`` long).

A VLA's sft run (behaviour cloning on the tabletop, ``actor.model.kind=vla``) is not
planned. The memory remedies every language-model run shares (`lm_remedies`) live here, below
the reasoning task, which builds on this one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from rlinf_jax.config.schema import Config
from rlinf_jax.flow.optim import clipped_adamw
from rlinf_jax.flow.plan import NotPlanned, Program, Resident, laid_out, param_count, with_unrolled_twins
from rlinf_jax.policies.lm.hf_checkpoint import abstract_model, parse_dtype
from rlinf_jax.rollout.sampler import bucket_length
from rlinf_jax.sharding import (
    batch_divisor,
    component_mesh,
    param_shardings,
    resolve_placement,
    rules_from_config,
    state_shardings,
)
from rlinf_jax.sharding.mesh import batch_sharding, replicated
from rlinf_jax.tasks.sft.lm import COMPONENTS, LMTrainState, SFTStep, micro_loss, train_step
from rlinf_jax.tasks.sft.lm_model import lm_architecture
from rlinf_jax.tasks.sft.lm_setup import lm_transform, make_lora, trainable_params, trainable_value_and_grad


def programs(cfg: Config, devices, twins: bool = True) -> tuple[list[Program], list[Resident], list[str]]:
    """The optimiser step of the sft run ``cfg`` describes, laid out on ``devices``, the state
    that stays resident around it, and notes on what was assumed. A scanned model's step
    carries its unrolled twin, where the planner counts FLOPs (``twins=False``: memory only)."""
    return with_unrolled_twins(_programs, cfg, devices, twins)


def _programs(cfg: Config, devices) -> tuple[list[Program], list[Resident], list[str]]:
    m = cfg.actor.model
    if m.kind == "vla":
        raise NotPlanned(
            "planning an sft run of actor.model.kind=vla (behaviour cloning on the tabletop) is not supported yet; "
            "the planner knows a language model's sft run"
        )
    placement = resolve_placement(cfg.cluster.component_placement, COMPONENTS, len(devices), cfg.cluster.mesh)
    mesh = component_mesh(placement, "actor", devices)
    rules = rules_from_config(cfg.cluster.partition_rules)

    config = lm_architecture(cfg)
    dtype = parse_dtype(m.dtype)
    param_dtype = parse_dtype(m.param_dtype) if m.param_dtype else dtype
    model = abstract_model(config, dtype, param_dtype, scan_layers=m.scan_layers)
    model.remat = m.remat  # as `load_policy` sets it: a static setting of the traced step
    graphdef, policy = nnx.split(model)
    lora = make_lora(policy, m)
    n_params = param_count(policy)

    # The trainer's state, as `SFTTrainer` builds it: parameters laid out by the partition
    # rules, the optimiser state alike, the counters replicated.
    params = jax.eval_shape(lambda p: trainable_params(p, lora, 0), policy)
    params_at = param_shardings(params, mesh, rules)
    params = laid_out(params, params_at)
    o = cfg.actor.optim
    tx, schedule = clipped_adamw(o.lr, o.max_grad_norm, o.weight_decay, o.warmup_steps, o.lr_schedule,
                                 cfg.runner.max_steps)
    tx = lm_transform(tx, lora)
    opt = jax.eval_shape(tx.init, params)
    opt_at = state_shardings(opt, mesh, rules)
    opt = laid_out(opt, opt_at)
    rep = replicated(mesh)
    counter = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
    state = LMTrainState(params, opt, counter, counter)
    shardings = LMTrainState(params_at, opt_at, rep, rep)  # the step's out_shardings, as the trainer's

    B, micro = cfg.actor.global_batch_size, cfg.actor.micro_batch_size
    P = bucket_length(cfg.data.max_prompt_length, 8)  # the prompt encoder's widest bucket
    N = cfg.rollout.max_new_tokens
    batch = _batch(mesh, B, P, N, micro)
    spec = SFTStep(graphdef, lora, tx, schedule, micro, m.logits_chunk)
    step = jax.jit(functools.partial(train_step, spec), donate_argnums=0, out_shardings=(shardings, None))

    tokens = B * (P + N)
    # The micro-batch scan is one loop trip to the compiler: the other micro-batches'
    # forward and backward are costed from their own lowered program.
    grad = jax.jit(trainable_value_and_grad(lambda p, mb, total: micro_loss(spec, p, mb, total), lora))
    total = jax.ShapeDtypeStruct((), jnp.float32, sharding=rep)
    more = ((grad, (params, _batch(mesh, micro, P, N, micro), total), B // micro - 1),)
    train_flops = 6.0 * matmul_params(config, n_params) * tokens
    out = [Program("actor", "train_step", step, (state, batch), model_flops=train_flops,
                   holds=("actor params", "actor optimizer"), more=more)]
    residents = [Resident("actor", "actor params", params), Resident("actor", "actor optimizer", opt)]
    split = micro % batch_divisor(mesh) == 0 and B == micro
    notes = [
        f"{config.model_type} with {n_params / 1e9:.3f} B parameters ({config.num_layers} layers, "
        f"{'scanned' if m.scan_layers else 'unrolled'}), {jnp.dtype(param_dtype).name} parameters, "
        f"{jnp.dtype(dtype).name} compute" + (f", LoRA rank {m.lora_rank}" if lora is not None else "")
        + (f" on an {m.base_qtype} base" if lora is not None and m.base_qtype != "none" else ""),
        f"the actor on {len(devices)} chip(s) {dict(placement.components['actor'].mesh_shape)}",
        f"an iteration is one optimiser step: {B} examples in micro-batches of {micro}, prompts padded to {P} tokens, "
        f"targets of {N} tokens; the batch is {'split over' if split else 'replicated on'} the batch axes "
        "(as the trainer places it); the held-out evaluation's sampling is not planned",
    ]
    return out, residents, notes


def _batch(mesh, rows: int, prompt: int, target: int, micro: int) -> dict:
    """An sft batch of ``rows`` examples as `SFTTrainer.next_batch` lays it out: every leaf
    of ``micro`` rows split over the batch axes where they divide it (`place_rows`), the
    rest replicated. (A procedural or file dataset's batch: tool-use transcripts also carry
    ``response_valid``, which the loss does not read.)"""
    split = rows == micro and micro % batch_divisor(mesh) == 0
    sharding = batch_sharding(mesh) if split else replicated(mesh)
    shapes = {"prompt_ids": prompt, "prompt_mask": prompt, "tokens": target, "response_mask": target}
    return {k: jax.ShapeDtypeStruct((rows, n), jnp.int32, sharding=sharding) for k, n in shapes.items()}


def matmul_params(config, n_params: int) -> int:
    """The parameters a token multiplies by (the model FLOPs' 2 per parameter per token): all
    of them but an untied input embedding, which is looked up, not multiplied."""
    return n_params - (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size)


def lm_remedies(cfg: Config) -> list[tuple[str, dict]]:
    """The memory remedies any language model's training takes, each as the config keys that
    say it: those of ``actor.model`` this config lacks (chunked log-probs, rematerialised
    blocks, LoRA, QLoRA) and halved micro-batches."""
    m = cfg.actor.model
    out = []
    if m.logits_chunk == 0 and m.matmul == "xla":
        out.append(("log-probs in chunks of 8192 vocabulary columns", {"actor.model.logits_chunk": 8192}))
    if m.remat == "none":
        out.append(("every decoder block rematerialised in the backward pass",
                    {"actor.model.remat": "full", "actor.model.scan_layers": True}))
    micro = cfg.actor.micro_batch_size
    if micro > 1 and micro % 2 == 0:
        out.append((f"micro-batches of {micro // 2} sequences", {"actor.micro_batch_size": micro // 2}))
    if m.lora_rank == 0:
        out.append(("LoRA adapters of rank 16 (no optimiser state for the base)", {"actor.model.lora_rank": 16}))
    if m.base_qtype == "none":
        out.append(("QLoRA: the base in NF4 with rank-16 adapters",
                    {"actor.model.lora_rank": max(16, m.lora_rank), "actor.model.base_qtype": "nf4"}))
    return out


def remedies(cfg: Config) -> list[tuple[str, dict]]:
    """What would lower an sft run's memory per chip: the language model's remedies (a VLA's
    sft run is not planned, so it has none)."""
    return [] if cfg.actor.model.kind == "vla" else lm_remedies(cfg)

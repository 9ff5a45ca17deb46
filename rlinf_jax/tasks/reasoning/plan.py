"""A reasoning run's iteration as programs for the planner (`rlinf_jax.flow.plan`): the
rollout's prefill and decode loop, the reference model's log-probs, and the actor's update,
each the very jitted function the trainer calls, given abstract arguments laid out on the
run's component meshes over the target's devices. No weights are read and no data: shapes
come from the architecture (`tasks.sft.lm_model.lm_architecture`) and the config's sizes,
at their largest (prompts at ``data.max_prompt_length``, responses at
``rollout.max_new_tokens``, every one reaching it).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rlinf_jax.config.schema import Config
from rlinf_jax.flow.optim import clipped_adamw, guarded_update
from rlinf_jax.flow.plan import Program, Resident, laid_out, param_count, with_unrolled_twins
from rlinf_jax.policies.lm.hf_checkpoint import abstract_model, parse_dtype
from rlinf_jax.policies.lm.logprobs import policy_logprobs
from rlinf_jax.rollout.sampler import Layout, bucket_length, decode_tokens, prefill_prompts
from rlinf_jax.sharding import (
    batch_axes,
    batch_divisor,
    component_mesh,
    param_shardings,
    rules_from_config,
    state_shardings,
)
from rlinf_jax.sharding.mesh import batch_sharding, replicated
from rlinf_jax.tasks.reasoning import update as rl
from rlinf_jax.tasks.reasoning.config import check_algorithm, components
from rlinf_jax.tasks.reasoning.config import placement as place
from rlinf_jax.tasks.sft.lm_model import lm_architecture
from rlinf_jax.tasks.sft.lm_setup import lm_transform, make_lora, policy_weights, trainable_params
from rlinf_jax.tasks.sft.plan import lm_remedies, matmul_params


def _rows(shape, dtype, mesh, rows: int):
    """A batch array whose leading rows split over the mesh's batch axes where they divide."""
    split = batch_axes(mesh) and rows % batch_divisor(mesh) == 0
    return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(mesh) if split else replicated(mesh))


def programs(cfg: Config, devices, twins: bool = True) -> tuple[list[Program], list[Resident], list[str]]:
    """The programs of one iteration of the run ``cfg`` describes, laid out on ``devices``,
    the state that stays resident between them, and notes on what was assumed. A scanned
    model's programs carry their unrolled twins, where the planner counts FLOPs (not
    needed for memory alone: ``twins=False``)."""
    return with_unrolled_twins(_programs, cfg, devices, twins)


def _programs(cfg: Config, devices) -> tuple[list[Program], list[Resident], list[str]]:
    check_algorithm(cfg)
    a, m, ro = cfg.algorithm, cfg.actor.model, cfg.rollout
    names = components(cfg)
    placement = place(cfg, len(devices))
    meshes = {c: component_mesh(placement, c, devices) for c in names}
    rules = rules_from_config(cfg.cluster.partition_rules)

    config = lm_architecture(cfg)
    dtype = parse_dtype(m.dtype)
    param_dtype = parse_dtype(m.param_dtype) if m.param_dtype else dtype
    model = abstract_model(config, dtype, param_dtype, scan_layers=m.scan_layers)
    model.remat = m.remat  # as `load_policy` sets it: a static setting of the traced programs
    graphdef, policy = nnx.split(model)
    lora = make_lora(policy, m)
    params = jax.eval_shape(lambda p: trainable_params(p, lora, 0), policy)
    n_params = param_count(policy)
    flop_params = matmul_params(config, n_params)

    prompts, group = cfg.data.rollout_batch_size, a.lm.group_size
    samples = prompts * group
    P = bucket_length(cfg.data.max_prompt_length, 8)
    N = ro.max_new_tokens
    notes = [
        f"{config.model_type} with {n_params / 1e9:.2f} B parameters ({config.num_layers} layers, "
        f"{'scanned' if m.scan_layers else 'unrolled'}), {jnp.dtype(param_dtype).name} parameters, "
        f"{jnp.dtype(dtype).name} compute",
        f"placement {placement.mode}: " + ", ".join(
            f"{c} on {len(placement.components[c].devices)} chip(s) {dict(placement.components[c].mesh_shape)}"
            for c in names
        ),
        f"an iteration: {prompts} prompts x {group} samples, prompts padded to {P} tokens, responses of "
        f"{N} tokens (every response at the limit: the worst case)",
    ]
    dynamic = "update" in placement.phases
    if dynamic:
        phase = placement.phases["update"]
        notes.append(f"cluster.scaling=dynamic: the update runs on {len(phase.devices)} chip(s) "
                     f"{dict(phase.mesh_shape)}: the actor's and those of the components idle meanwhile; the actor's "
                     "state moves there and back every iteration")
        if len({getattr(d, "process_index", 0) for d in devices}) > 1:
            notes.append("the moves are costed device to device over the chips' links; across hosts this build "
                         "moves the state through the hosts' memory instead (correct, far slower), so on this "
                         "target the gain needs a device-to-device move between hosts, not built yet")

    # ---------------------------------------------------------------- actor
    home = meshes["actor"]
    n_mini = samples // cfg.actor.global_batch_size
    o = cfg.actor.optim
    total = cfg.runner.max_steps * a.update_epochs * n_mini
    tx, schedule = clipped_adamw(o.lr, o.max_grad_norm, o.weight_decay, o.warmup_steps, o.lr_schedule, total)
    tx = lm_transform(tx, lora)

    def state_on(mesh):
        laid = laid_out(params, param_shardings(params, mesh, rules))
        opt = jax.eval_shape(tx.init, laid)
        return laid, laid_out(opt, state_shardings(opt, mesh, rules))

    # Where the state rests (the actor's mesh) and where the update runs on it (the same
    # mesh, or with cluster.scaling=dynamic the update phase's).
    home_params, home_opt = state_on(home)
    actor = component_mesh(placement, "update", devices) if dynamic else home
    actor_params, opt = state_on(actor) if dynamic else (home_params, home_opt)
    layout = None
    if cfg.actor.micro_batch_size % batch_divisor(actor) == 0 and batch_axes(actor):
        layout = NamedSharding(actor, PartitionSpec(None, None, batch_axes(actor)))
    u = rl.RLUpdate.of(cfg, graphdef, None, lora, tx, schedule, samples, layout)
    state = rl.RLState(actor_params, opt, jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated(actor)),
                       jax.ShapeDtypeStruct((), jnp.int32, sharding=replicated(actor)))
    batch = {
        "prompt_ids": _rows((samples, P), jnp.int32, actor, samples),
        "prompt_mask": _rows((samples, P), jnp.int32, actor, samples),
        "tokens": _rows((samples, N), jnp.int32, actor, samples),
        "response_mask": _rows((samples, N), jnp.float32, actor, samples),
        "sampler_logp": _rows((samples, N), jnp.float32, actor, samples),
        "rewards": _rows((samples,), jnp.float32, actor, samples),
    }
    if a.lm.kl_coef > 0:
        batch["ref_logp"] = _rows((samples, N), jnp.float32, actor, samples)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated(actor))
    update = jax.jit(functools.partial(rl.update, u), donate_argnums=0)
    # Forward and backward of every token, per epoch, plus the old log-probs' forward. With
    # shared prompts (`prompt_group`) a group's prompt is run once for its samples: the
    # model's work is each distinct prompt once and every response.
    tokens = samples * N + (samples // u.prompt_group) * P
    passes = 6.0 * a.update_epochs + (2.0 if u.recompute_old else 0.0)
    train_flops = passes * flop_params * tokens
    out: list[Program] = [
        Program("actor", "update", update, (state, batch, key), model_flops=train_flops,
                holds=("actor params", "actor optimizer"), more=_update_loops(u, actor_params, opt, batch, actor),
                switch=((home_params, home_opt), (actor_params, opt)) if dynamic else ()),
    ]
    residents = [
        Resident("actor", "actor params", home_params),
        Resident("actor", "actor optimizer", home_opt),
    ]

    # ---------------------------------------------------------------- reference
    if a.lm.kl_coef > 0:
        ref_mesh = meshes["reference"]
        ref_params = laid_out(policy, param_shardings(policy, ref_mesh, rules))
        rows = {k: _rows(batch[k].shape, batch[k].dtype, ref_mesh, samples)
                for k in ("prompt_ids", "prompt_mask", "tokens", "response_mask")}
        ref_layout = None
        if cfg.actor.micro_batch_size % batch_divisor(ref_mesh) == 0 and batch_axes(ref_mesh):
            ref_layout = rl.chunk_layout(ref_mesh, batch_axes(ref_mesh))
        ref = jax.jit(functools.partial(rl.reference_logprobs, graphdef, u.temperature, cfg.actor.micro_batch_size,
                                        u.prompt_group, logits_chunk=u.logits_chunk, layout=ref_layout))
        chunks = samples // cfg.actor.micro_batch_size if samples % cfg.actor.micro_batch_size == 0 else 1
        out.append(Program("reference", "logprobs", ref, (ref_params, rows), model_flops=2.0 * flop_params * tokens,
                           loop_trips=chunks, holds=("reference params",)))
        residents.append(Resident("reference", "reference params", ref_params))

    # ---------------------------------------------------------------- rollout
    rollout = meshes["rollout"]
    roll_params = laid_out(policy, param_shardings(policy, rollout, rules))
    # Released before the update and rebuilt by the weight sync after it (the trainer's).
    residents.append(Resident("rollout", "rollout params", roll_params, absent_during=("actor",)))
    gen = bucket_length(N, 8)
    lay = Layout.for_batch(rollout, samples, config.num_kv_heads, rules)
    prompt_lay = Layout.for_batch(rollout, prompts, config.num_kv_heads, rules) if group > 1 else None
    rep = replicated(rollout)
    scalar = lambda dt: jax.ShapeDtypeStruct((), dt, sharding=rep)  # noqa: E731
    stops = jax.ShapeDtypeStruct((1,), jnp.int32, sharding=rep)
    static = {"greedy": ro.temperature == 0, "top_k": int(ro.top_k), "use_top_p": ro.top_p < 1.0, "pad_id": 0}
    prefill_rows = (prompt_lay or lay).rows
    prefill_args = (
        graphdef, roll_params,
        jax.ShapeDtypeStruct((prompts, P), jnp.int32, sharding=prefill_rows),
        jax.ShapeDtypeStruct((prompts, P), jnp.bool_, sharding=prefill_rows),
        jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep),
        jax.ShapeDtypeStruct((samples,), jnp.uint32, sharding=lay.rows),
        scalar(jnp.float32), scalar(jnp.float32), stops,
    )
    prefill_kw = {"gen_len": gen, "layout": lay, "group": group, "prompt_layout": prompt_lay, **static}
    # The decode loop's state is what the prefill returns: its shapes, on the layout it pins.
    decode_state = jax.eval_shape(functools.partial(prefill_prompts, **prefill_kw), *prefill_args)
    decode_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), decode_state,
                                _state_layout(decode_state, lay))
    out.insert(0, Program("rollout", "prefill", prefill_prompts, prefill_args, prefill_kw,
                          model_flops=2.0 * flop_params * prompts * P, holds=("rollout params",)))
    out.insert(1, Program(
        "rollout", "decode", decode_tokens,
        (graphdef, roll_params, decode_state, scalar(jnp.int32), scalar(jnp.float32), scalar(jnp.float32), stops),
        {"prompt_len": P, "layout": lay, **static},
        loop_trips=N - 1, model_flops=2.0 * flop_params * samples * (N - 1), holds=("rollout params",),
    ))
    return out, residents, notes


def _update_loops(u: rl.RLUpdate, params, opt, batch: dict, mesh) -> tuple:
    """The update's loop trips beyond the one the compiler costs: every other micro-batch's
    forward and backward, every other optimiser step, and the other chunks of the old
    log-probs' forward pass."""
    a = u.algorithm
    micro = {k: _rows((u.micro, *v.shape[1:]), v.dtype, mesh, u.micro) for k, v in batch.items()}
    n = batch["tokens"].shape[1]
    micro["advantages"] = _rows((u.micro, n), jnp.float32, mesh, u.micro)
    if u.recompute_old:
        micro["old_logp"] = _rows((u.micro, n), jnp.float32, mesh, u.micro)
    scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated(mesh))
    totals = {"tokens": scalar, "nonempty": scalar, "seqs": scalar}
    grad = jax.jit(jax.value_and_grad(lambda p, mb, t: rl.micro_loss(u, p, mb, t), has_aux=True))
    step = jax.jit(lambda g, p, o, loss: guarded_update(u.tx, g, p, o, loss))
    steps = a.update_epochs * u.n_mini
    more = [(grad, (params, micro, totals), steps * u.n_micro - 1), (step, (params, params, opt, scalar), steps - 1)]
    if u.recompute_old:
        samples = batch["tokens"].shape[0]
        chunks = samples // u.micro if samples % u.micro == 0 else 1
        forward = jax.jit(lambda p, mb: policy_logprobs(nnx.merge(u.graphdef, policy_weights(u.lora, p)), mb,
                                                        u.temperature, u.prompt_group)[0])
        more.append((forward, (params, micro), chunks - 1))
    return tuple(more)


def _state_layout(state, layout: Layout):
    """The shardings `Layout.pin_state` gives a decode state."""
    rows = {f: layout.rows for f in ("key_mask", "prompt_lengths", "uniforms", "tokens", "logprobs", "done")}
    cache = jax.tree.map(lambda _: layout.cache, state.cache)
    if state.cache.stacked:
        # A stacked cache carries the layer axis first: the rows are its second axis.
        spec = layout.cache.spec
        cache = jax.tree.map(lambda _: NamedSharding(layout.cache.mesh, PartitionSpec(None, *spec)), state.cache)
    return state._replace(cache=cache, step=layout.replicated, **rows)


def remedies(cfg: Config) -> list[tuple[str, dict]]:
    """What would lower a reasoning run's memory per chip, each as the config keys that say
    it (the planner tries each one, and all together): a language model's remedies this
    config lacks, and one optimiser step an iteration."""
    out = lm_remedies(cfg)
    samples = cfg.data.rollout_batch_size * cfg.algorithm.lm.group_size
    if cfg.actor.global_batch_size < samples:
        out.insert(min(2, len(out)), ("one optimiser step an iteration (no shuffled mini-batches to carry)",
                                      {"actor.global_batch_size": samples}))
    return out

"""`python -m rlinf_jax.profile`: where each workload stands against this machine's limit.

First the machine: matrix-product peaks (float32 and bfloat16) through XLA, and through
torch when it is installed (the reference for what the silicon does), and the memory
bandwidth of a large element-wise op. On a GPU or TPU the device's published peaks are
shown beside them. Then one iteration of each workload, stage by stage (PPO control:
rollout, update; GRPO reasoning with a tiny language model: sampler prefill, sampler
decode, update; SAC: one iteration of env step and gradient steps; the tiny VLA of
``ppo_vla_tabletop``: rollout on the tabletop's images, update), each stage its own
jitted program, timed after a warm-up (median of ``--repeats`` runs).

XLA's peak is the best of square products of several sizes up to ``--matmul-size``, each
alone and one per core side by side in one program (which is fastest depends on the
CPU's caches and on how XLA spreads a product over the cores). Each stage's share is of
the faster of that peak and XLA's best product timed again right after the stage
(``peak_flop_per_s``): on a machine shared with other jobs the peak read at the start
moved fourfold between runs (43 to 169 GFLOP/s on a 2-core AMD EPYC), and a stage timed
under less load than the peak showed more than 100% of it.

Per stage it reports FLOPs, achieved FLOP/s, share of the peak (on a GPU or TPU the
published dense bfloat16 peak; on a CPU ``peak_float32``, the best of XLA's and torch's
measured float32 products), and the bound:

- FLOPs are counted on the stage's jaxpr (2*M*N*K per matrix product, one per element of
  other arithmetic ops, none for ops that only move data), loops times their trip counts.
  XLA's own cost analysis (``compiled.cost_analysis()``) counts a loop body once, whatever
  its trip count; its figures are shown too (``xla_flops``), and its bytes-per-FLOP gives
  the stage's arithmetic intensity.
- bound: of the two floors on the stage's time, its FLOPs at the peak and its bytes at the
  measured bandwidth, the larger one when it explains at least 40% of the time
  (``compute`` or ``memory``); otherwise ``dispatch``: the time goes to neither (per-op
  launch and loop overhead, kernels too small to use the cores).
- Figures are wall clock: on a machine shared with other jobs, peaks and stages alike are
  lower, and the shares are only as good as the load was steady.

The last stdout line is one JSON object with everything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

# Published dense peaks (FLOP/s) and memory bandwidth (bytes/s), from the vendors' data
# sheets, matched against `jax.devices()[0].device_kind`.
PUBLISHED_PEAKS = {
    "H200": {"bf16": 989e12, "f32": 67e12, "bandwidth": 4.8e12},
    "H100": {"bf16": 989e12, "f32": 67e12, "bandwidth": 3.35e12},
    "A100": {"bf16": 312e12, "f32": 19.5e12, "bandwidth": 2.04e12},
    "L4": {"bf16": 121e12, "f32": 30.3e12, "bandwidth": 0.3e12},
    "TPU v6": {"bf16": 918e12, "bandwidth": 1.64e12},
    "TPU v5p": {"bf16": 459e12, "bandwidth": 2.77e12},
    "TPU v5": {"bf16": 197e12, "bandwidth": 0.82e12},  # v5e / v5 lite
    "TPU v4": {"bf16": 275e12, "bandwidth": 1.2e12},
}

WORKLOADS = ("ppo", "grpo", "sac", "vla")


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m rlinf_jax.profile", description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    p.add_argument("--matmul-size", type=int, default=2048, help="side of the square matrices of the peak test")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. runner.xla_cpu_flags=")
    return p.parse_args(argv)


# ------------------------------------------------------------------ counting
def _size(aval) -> int:
    return math.prod(getattr(aval, "shape", ()) or (1,))


def _sub_jaxprs(params):
    for v in params.values():
        for item in v if isinstance(v, (tuple, list)) else (v,):
            if hasattr(item, "eqns"):  # a Jaxpr
                yield item
            elif hasattr(getattr(item, "jaxpr", None), "eqns"):  # a ClosedJaxpr
                yield item.jaxpr


# Ops that only move or lay out data: no arithmetic, so no FLOPs (XLA's cost analysis
# counts none either). Counted one per element, they made a third of the PPO rollout's
# count and put a stage that is one matrix product above the product's own peak.
MOVES = frozenset({
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "gather", "rev", "copy", "copy_p", "device_put",
    "sharding_constraint", "iota", "split", "bitcast_convert_type",
})


def count_flops(jaxpr, while_trips: int = 1) -> float:
    """FLOPs of a jaxpr: matrix products 2*K per output element, convolutions likewise,
    ops that only move data (`MOVES`) none, every other op one per output element
    (reductions one per input element); scans times their length, while loops times
    ``while_trips``, conds their costliest branch."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name, params = eqn.primitive.name, eqn.params
        outs = sum(_size(v.aval) for v in eqn.outvars)
        if name in MOVES:
            continue
        if name == "dot_general":
            (lhs_contract, _), _ = params["dimension_numbers"]
            shape = eqn.invars[0].aval.shape
            total += 2.0 * math.prod(shape[i] for i in lhs_contract) * outs
        elif name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            out_feature = params["dimension_numbers"].rhs_spec[0]
            total += 2.0 * outs * math.prod(rhs) / rhs[out_feature]
        elif name == "scan":
            total += params["length"] * count_flops(params["jaxpr"].jaxpr, while_trips)
        elif name == "while":
            total += while_trips * count_flops(params["body_jaxpr"].jaxpr, while_trips)
        elif name == "cond":
            total += max(count_flops(b.jaxpr, while_trips) for b in params["branches"])
        elif any(True for _ in _sub_jaxprs(params)):
            total += sum(count_flops(j, while_trips) for j in _sub_jaxprs(params))
        elif name.startswith(("reduce_", "argmax", "argmin", "cum")):
            total += sum(_size(v.aval) for v in eqn.invars if hasattr(v, "aval"))
        else:
            total += outs
    return total


def _timed(fn, args, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ------------------------------------------------------------------ the machine
# Smaller products measured beside --matmul-size's: the workloads' layers are this wide.
PEAK_SIZES = (256, 512, 1024)


def cores() -> int:
    """The cores this process may run on (one, for a process pinned to one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def matmul_rate(n: int, repeats: int, dtype: str = "float32", parallel: int = 1) -> float:
    """FLOP/s of ``parallel`` independent ``n`` x ``n`` matrix products in one XLA program,
    median of ``repeats`` runs."""
    import jax

    # Distinct operands: XLA would merge identical products into one.
    a = jax.random.normal(jax.random.PRNGKey(0), (parallel, n, n), dtype)
    products = jax.jit(lambda x: [x[i] @ x[i] for i in range(parallel)])
    return parallel * 2 * n**3 / _timed(products, (a,), repeats)


def matmul_rates(n: int, repeats: int, dtype: str = "float32") -> dict[str, float]:
    """``"<size>x<products>" -> FLOP/s`` of square products of every size in `PEAK_SIZES`
    below ``n`` and of ``n``, each alone and one per core side by side."""
    sizes = sorted({s for s in PEAK_SIZES if s < n} | {n})
    return {f"{s}x{p}": matmul_rate(s, repeats, dtype, p) for s in sizes for p in sorted({1, cores()})}


def matmul_peak(n: int, repeats: int, dtype: str = "float32") -> float:
    """The matrix-product peak through XLA, FLOP/s: the best of `matmul_rates`."""
    return max(matmul_rates(n, repeats, dtype).values())


def machine_peaks(n: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp

    out = {"platform": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
           "devices": jax.device_count()}
    for dtype in ("float32", "bfloat16"):
        rates = matmul_rates(n, repeats, dtype)
        out[f"xla_matmul_{dtype}"] = max(rates.values())
        out[f"xla_matmul_{dtype}_by_size"] = rates  # "<size>x<products side by side>"
    # 128 MiB read and written in place (donated: a fresh output buffer would time the
    # kernel's page zeroing, not the memory).
    x = jnp.ones((1 << 25,), jnp.float32)
    scale = jax.jit(lambda v: v * 0.5 + 1.0, donate_argnums=0)
    x = jax.block_until_ready(scale(x))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        x = jax.block_until_ready(scale(x))
        times.append(time.perf_counter() - t)
    out["xla_bandwidth"] = 2 * x.nbytes / statistics.median(times)
    out["peak_float32"] = out["xla_matmul_float32"]
    kind = out["device_kind"]
    for name, peaks in PUBLISHED_PEAKS.items():
        if out["platform"] != "cpu" and name.lower() in kind.lower():
            out["published"] = {"name": name, **peaks}
            break
    try:
        import torch  # optional: the reference for what the silicon does
    except ImportError:
        return out
    for dtype in ("float32", "bfloat16"):
        a = torch.randn(n, n, dtype=getattr(torch, dtype))
        torch.mm(a, a)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            torch.mm(a, a)
            times.append(time.perf_counter() - t)
        out[f"torch_matmul_{dtype}"] = 2 * n**3 / statistics.median(times)
    out["torch_threads"] = torch.get_num_threads()
    # A model built with matmul=mkl runs MKL's products, which may beat XLA's own.
    out["peak_float32"] = max(out["xla_matmul_float32"], out["torch_matmul_float32"])
    return out


# ------------------------------------------------------------------ stages
def stage_peak(peaks: dict, repeats: int = 0) -> float:
    """The FLOP/s a stage's share is of: a GPU's or TPU's published dense bfloat16 peak,
    else the measured float32 one (`machine_peaks`' ``peak_float32``). With ``repeats``,
    XLA's best product is timed again now, right after the stage, and the faster of the
    two counts: on a machine shared with other jobs the load moves the stage and the peak
    alike, and a peak measured under more load than the stage read low."""
    published = peaks.get("published", {})
    peak = published.get("bf16" if peaks["platform"] != "cpu" else "f32") or peaks["peak_float32"]
    rates = peaks.get("xla_matmul_float32_by_size")
    if repeats and rates and not published:
        size, side_by_side = max(rates, key=rates.get).split("x")
        peak = max(peak, matmul_rate(int(size), repeats, "float32", int(side_by_side)))
    return peak


def stage(name: str, fn, args, peaks: dict, repeats: int, while_trips: int = 1) -> tuple[dict, object]:
    """Times ``fn(*args)`` (compiled once) and places it against the peaks; returns the
    record and the function's output."""
    import jax

    flops = count_flops(jax.make_jaxpr(fn)(*args).jaxpr, while_trips)
    compiled = jax.jit(fn).lower(*args).compile()
    out = compiled(*args)
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
    xla_flops, xla_bytes = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    seconds = _timed(compiled, args, repeats)
    peak = stage_peak(peaks, repeats)
    bandwidth = peaks.get("published", {}).get("bandwidth") or peaks["xla_bandwidth"]
    achieved = flops / seconds
    bytes_est = flops * (xla_bytes / xla_flops) if xla_flops > 0 else xla_bytes
    compute_share, memory_share = achieved / peak, bytes_est / bandwidth / seconds
    if max(compute_share, memory_share) >= 0.4:
        bound = "compute" if compute_share >= memory_share else "memory"
    else:
        bound = "dispatch"
    return {
        "stage": name, "seconds": seconds, "flops": flops, "xla_flops": xla_flops, "xla_bytes": xla_bytes,
        "flop_per_s": achieved, "peak_flop_per_s": peak, "share_of_peak": achieved / peak,
        "bytes_per_flop": (xla_bytes / xla_flops) if xla_flops else None,
        "memory_time_share": bytes_est / bandwidth / seconds, "bound": bound,
    }, out


def ppo_stages(overrides, peaks, repeats, recipe: str = "ppo_brax", prefix: str = "ppo") -> list[dict]:
    """One PPO rollout and one PPO update of ``recipe`` (the control MLP's, or with
    ``ppo_vla_tabletop`` the tiny VLA's on the tabletop's images)."""
    import jax

    from rlinf_jax.api import load_config
    from rlinf_jax.rollout.env_rollout import unroll
    from rlinf_jax.tasks.embodied import ppo
    from rlinf_jax.tasks.embodied.build import build_trainer

    trainer = build_trainer(load_config(recipe, ["runner.progress_bar=false", *overrides]))
    ts = trainer.init()
    algorithm = trainer.algorithm
    learner, env, T = algorithm.learner, algorithm.env, algorithm.learner.settings.rollout_length
    key = jax.random.PRNGKey(1)

    def rollout(ts, key):
        return unroll(env, ppo.acting(learner, ts.params, ts.obs_stats), ts.env_state, key, T)

    rolled, (env_state, traj) = stage(f"{prefix}/rollout", rollout, (ts, key), peaks, repeats)

    def update(ts, traj, last_obs, key):
        return ppo.learn(learner, ts.replace(env_state=None), traj, last_obs, key)

    return [rolled, stage(f"{prefix}/update", update, (ts, traj, env_state.obs, key), peaks, repeats)[0]]


def sac_stages(overrides, peaks, repeats) -> list[dict]:
    import jax.numpy as jnp

    from rlinf_jax.api import load_config
    from rlinf_jax.tasks.offpolicy.run import build_trainer

    trainer = build_trainer(load_config("sac_brax", ["runner.progress_bar=false", *overrides]))
    ts = trainer.init()
    algorithm = trainer.algorithm
    # Past the random warm-up, so the timed iteration takes its gradient steps.
    a = algorithm.cfg.algorithm
    warm = a.offpolicy.learning_starts // (algorithm.env.num_envs * a.rollout_length) + 1
    ts, _ = trainer.run_chunk(ts, algorithm.demos, jnp.int32(warm))

    def iteration(ts):
        return algorithm.chunk(ts, algorithm.demos, 1)

    return [stage("sac/iteration", iteration, (ts,), peaks, repeats)[0]]


def grpo_stages(peaks, repeats, batch=32, prompt=24, new_tokens=64) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from rlinf_jax.policies.lm import CausalLM, LMConfig
    from rlinf_jax.rollout import sampler as sampling

    # The tiny model of benchmarks/sampler_vs_hf.py (Qwen2, ~2.9M parameters).
    cfg = LMConfig(model_type="qwen2", vocab_size=2048, hidden_size=256, intermediate_size=512, num_layers=4,
                   num_heads=4, num_kv_heads=2, head_dim=64, tie_word_embeddings=True, attention_bias=True)
    graphdef, params = nnx.split(CausalLM(cfg, rngs=nnx.Rngs(0)))
    ids = jnp.asarray(np.random.default_rng(0).integers(1, cfg.vocab_size, (batch, prompt)), jnp.int32)
    mask = jnp.ones((batch, prompt), bool)
    key, samples = jax.random.PRNGKey(0), jnp.arange(batch, dtype=jnp.uint32)
    scalars = (jnp.float32(1.0), jnp.float32(1.0), jnp.asarray([-1], jnp.int32))
    static = {"greedy": False, "top_k": 0, "use_top_p": False, "pad_id": 0}

    def prefill(params):
        return sampling.prefill_prompts.__wrapped__(graphdef, params, ids, mask, key, samples, *scalars,
                                             gen_len=new_tokens, **static)

    filled, state = stage("grpo/sampler_prefill", prefill, (params,), peaks, repeats)

    def decode(params, state):
        return sampling.decode_tokens.__wrapped__(graphdef, params, state, jnp.int32(new_tokens), *scalars,
                                            prompt_len=prompt, **static)

    decoded, final = stage("grpo/sampler_decode", decode, (params, state), peaks, repeats, while_trips=new_tokens - 1)
    tokens = jnp.concatenate([ids, final.tokens], axis=1)
    tx = optax.adamw(5e-5)

    def update(params, opt_state, tokens):
        def loss_fn(p):
            logp = jax.nn.log_softmax(nnx.merge(graphdef, p)(tokens)[:, prompt - 1:-1], axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, tokens[:, prompt:, None], axis=-1))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return [filled, decoded, stage("grpo/update", update, (params, tx.init(params), tokens), peaks, repeats)[0]]


def _fmt(x: float) -> str:
    return f"{x / 1e9:,.1f} GFLOP/s" if x < 1e12 else f"{x / 1e12:,.2f} TFLOP/s"


def main(argv=None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    from rlinf_jax.api import prepare_jax
    from rlinf_jax.errors import BadInput

    prepare_jax(None, args.overrides)  # before JAX starts: runner.xla_cpu_flags
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        print(f"error: unknown workload {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    peaks = machine_peaks(args.matmul_size, args.repeats)
    print(f"{peaks['platform']} ({peaks['device_kind']}, {peaks['devices']} device(s)); "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    for k, v in peaks.items():
        if k.startswith(("xla_matmul", "torch_matmul")) and not k.endswith("_by_size"):
            print(f"  peak {k:24s} {_fmt(v)}")
    rates = peaks["xla_matmul_float32_by_size"]
    size, side_by_side = max(rates, key=rates.get).split("x")
    print(f"  XLA's best float32 products: {size} wide, {side_by_side} side by side; shares are of "
          f"{_fmt(stage_peak(peaks))}")
    print(f"  memory bandwidth (XLA)       {peaks['xla_bandwidth'] / 1e9:,.1f} GB/s")
    overrides = [o for o in args.overrides if not o.startswith("runner.xla_cpu_flags")]
    stages = []
    try:
        for w in args.workloads.split(","):
            if w == "ppo":
                stages += ppo_stages(overrides, peaks, args.repeats)
            elif w == "vla":
                # The timing does not depend on what the policy has learnt: no warm start.
                vla = ["sft.warm_start_steps=0", "sft.critic_warmup_steps=0", *overrides]
                stages += ppo_stages(vla, peaks, args.repeats, "ppo_vla_tabletop", "vla")
            elif w == "sac":
                stages += sac_stages(overrides, peaks, args.repeats)
            else:
                stages += grpo_stages(peaks, args.repeats)
            for s in stages[-3:] if w == "grpo" else stages[-2:] if w in ("ppo", "vla") else stages[-1:]:
                print(f"  {s['stage']:22s} {s['seconds'] * 1e3:9.1f} ms  {s['flops'] / 1e9:8.2f} GFLOP  "
                      f"{_fmt(s['flop_per_s']):>16s}  {s['share_of_peak']:6.1%} of peak  bound: {s['bound']}"
                      f" (memory {s['memory_time_share']:.0%} of the time)")
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"peaks": peaks, "stages": stages}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

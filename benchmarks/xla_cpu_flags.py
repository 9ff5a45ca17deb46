#!/usr/bin/env python
"""XLA CPU flag candidates timed on the project's own programs, in interleaved rounds.

XLA reads ``XLA_FLAGS`` once, when its CPU backend starts, so every candidate runs in its
own child process (one per candidate and workload). All children of a workload are started
first, each builds and compiles the program and runs one untimed block; then the parent
asks them in turn to time one block, ``--rounds`` times (candidate order rotated each
round), so a slow phase of a shared machine is spread over all candidates. A candidate's
figure is the median of its rounds, reported as a ratio to the first candidate (the
baseline, normally no flags). Children are pinned to the cores given by ``--cpus`` (all
to the same ones) before JAX starts.

Workloads (the programs the benchmarks time):

- ``ppo``: one fused PPO chunk (``ppo_vs_brax.py``'s ours side, inverted_pendulum, Brax
  positional), ``--ppo-iters`` iterations per block;
- ``lm_train``: the LM train step of ``train_step_vs_torch.py`` (32 x 128 tokens, the
  2.9M-parameter Qwen2), 2 steps per block;
- ``sampler``: ``sampler_vs_hf.py``'s sampling (32 prompts x 64 new tokens);
- ``sac``: one fused SAC chunk (``sac_vs_brax.py``'s ours side), 5 iterations per block;
- ``matmul_f32`` / ``matmul_bf16``: four 2048 x 2048 matrix products (the machine's peak,
  for comparison; not one of our programs).

Each child also reports a fingerprint of its results from the same starting state (the
first block's metrics or losses, the sampled tokens), compared with the baseline's: the
largest relative difference is printed beside the speed.

    python benchmarks/xla_cpu_flags.py --workloads ppo,lm_train --rounds 5 --cpus 1
    python benchmarks/xla_cpu_flags.py --candidate none= --candidate ynn=--xla_cpu_experimental_ynn_fusion_type=dot

The last stdout line is JSON: per workload and candidate the median seconds per block,
the ratio baseline / candidate (higher is faster) and the fingerprint difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CANDIDATES = {
    "none": "",
    "ynn_dot": "--xla_cpu_experimental_ynn_fusion_type=dot",
    "ynn_individual_dot": "--xla_cpu_experimental_ynn_fusion_type=individual_dot",
    "ynn_dot_eltwise_reduce": "--xla_cpu_experimental_ynn_fusion_type=dot,eltwise,reduce",
    "xnn_dot": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "onednn_dot": "--xla_cpu_experimental_onednn_fusion_type=dot",
    "onednn": "--xla_cpu_use_onednn=true",
    "no_eigen_mt": "--xla_cpu_multi_thread_eigen=false",
}


# ------------------------------------------------------------------------------ child side
def _ppo(args):
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, HERE)
    import ppo_vs_brax

    from rlinf_jax.tasks.embodied.build import build_trainer

    trainer = build_trainer(ppo_vs_brax.make_config(ppo_vs_brax.parse_args([])))
    ts = trainer.init()
    n = args.ppo_iters
    chunk = trainer.run_chunk.lower(ts, jnp.int32(1)).compile()
    state = {"ts": ts}

    def block():
        state["ts"], sums = chunk(state["ts"], jnp.int32(n))
        return trainer.summarize(sums, n)

    return block, lambda m: {k: float(v) for k, v in m.items()}, jax


def _sac(args):
    import jax

    sys.path.insert(0, HERE)
    import sac_vs_brax

    from rlinf_jax.tasks.offpolicy.run import build_trainer

    trainer = build_trainer(sac_vs_brax.make_config(sac_vs_brax.parse_args([])))
    ts = trainer.init()
    trainer.compile(ts, jax.random.PRNGKey(1))
    # Past the random warm-up (learning_starts) so every timed block takes gradient steps.
    ts, _ = trainer.run_iterations(ts, 2)
    state = {"ts": ts}

    def block():
        state["ts"], sums = trainer.run_iterations(state["ts"], 5)
        return trainer.summarize(sums, 5)

    return block, lambda m: {k: float(v) for k, v in m.items()}, jax


def _lm_model():
    import tempfile

    from rlinf_jax.policies.lm import from_pretrained
    from rlinf_jax.policies.lm.tiny import tiny_hf_model

    model = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 512, "vocab_size": 2048, "tie_word_embeddings": True}
    hf = tiny_hf_model("qwen2", seed=0, scale=0.1, attn_implementation="sdpa", **model)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        return from_pretrained(d), model


def _lm_train(args):
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    model, cfg = _lm_model()
    ids = jnp.asarray(np.random.default_rng(0).integers(0, cfg["vocab_size"], (32, 128)), jnp.int32)
    graphdef, params = nnx.split(model)
    tx = optax.adamw(3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1)

    def loss_fn(p, ids):
        logits = nnx.merge(graphdef, p)(ids)[:, :-1]
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(p, o, ids):  # ids an argument, as in the benchmark (a constant would be folded)
        loss, grads = jax.value_and_grad(loss_fn)(p, ids)
        updates, o = tx.update(grads, o, p)
        return optax.apply_updates(p, updates), o, loss

    state = {"p": params, "o": jax.jit(tx.init)(params)}

    def block():
        losses = []
        for _ in range(2):
            state["p"], state["o"], loss = step(state["p"], state["o"], ids)
            losses.append(loss)
        return [float(x) for x in losses]

    return block, lambda losses: {f"loss{i}": v for i, v in enumerate(losses)}, jax


def _sampler(args):
    import jax
    import numpy as np

    from rlinf_jax.rollout.sampler import Sampler, SamplingParams

    model, cfg = _lm_model()
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 25, 32)
    width = int(lengths.max())
    ids = np.zeros((32, width), np.int64)
    mask = np.zeros((32, width), np.int64)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = rng.integers(1, cfg["vocab_size"], n)
        mask[row, width - n:] = 1
    sampler = Sampler(model)
    params = SamplingParams(max_new_tokens=64, temperature=1.0)

    def block():
        return jax.block_until_ready(sampler.generate(ids, mask, jax.random.key(0), params))

    def fingerprint(out):
        tokens = np.asarray(out.tokens)
        return {"tokens_sum": float(tokens.sum()), "tokens_first_row": float(tokens[0].sum())}

    return block, fingerprint, jax


def _matmul(dtype):
    def build(args):
        import jax
        import jax.numpy as jnp

        a = jax.random.normal(jax.random.PRNGKey(0), (2048, 2048), dtype)
        product = jax.jit(lambda x: x @ x)

        def block():
            for _ in range(4):
                out = product(a)
            return float(jnp.sum(out.astype(jnp.float32)))

        return block, lambda total: {"sum": total}, jax

    return build


WORKLOADS = {"ppo": _ppo, "lm_train": _lm_train, "sampler": _sampler, "sac": _sac,
             "matmul_f32": _matmul("float32"), "matmul_bf16": _matmul("bfloat16")}


def child(args) -> None:
    """Builds one workload under the XLA_FLAGS it was started with, then times a block per
    `run` line on stdin, answering one line of JSON each."""
    t0 = time.perf_counter()
    block, fingerprint, jax = WORKLOADS[args.child](args)
    first = fingerprint(block())  # compile + warm-up; the fingerprint of the starting state
    print(json.dumps({"ready_s": time.perf_counter() - t0, "fingerprint": first,
                      "backend": jax.default_backend()}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t, c = time.perf_counter(), time.process_time()
        block()
        print(json.dumps({"s": time.perf_counter() - t, "cpu_s": time.process_time() - c}), flush=True)


# ------------------------------------------------------------------------------ parent side
def _start(name: str, flags: str, workload: str, args):
    env = dict(os.environ, XLA_FLAGS=flags)
    if not flags:
        env.pop("XLA_FLAGS")
    # The checkout this script belongs to, not whichever copy of the package is installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE), env.get("PYTHONPATH")]))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", workload, "--ppo-iters", str(args.ppo_iters)]
    if args.cpus:
        cmd = ["taskset", "-c", args.cpus, *cmd]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=os.getcwd())


def _read(proc) -> dict:
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"child exited (code {proc.wait()})")
        if line.startswith("{"):
            return json.loads(line)


def _diff(a: dict, b: dict) -> float:
    return max(abs(a[k] - b[k]) / max(abs(b[k]), 1e-8) for k in b) if b else 0.0


def run_workload(workload: str, candidates: dict, args) -> dict:
    procs = {name: _start(name, flags, workload, args) for name, flags in candidates.items()}
    try:
        ready = {}
        for name, proc in procs.items():  # children compile one after another on the cores
            try:
                ready[name] = _read(proc)
            except RuntimeError as err:
                print(f"[{workload}] {name}: failed to start ({err})", flush=True)
        names = [n for n in candidates if n in ready]
        if not names:
            raise SystemExit(f"error: no candidate of {workload} started")
        times = {n: [] for n in names}
        cpu = {n: [] for n in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                procs[name].stdin.write("run\n")
                procs[name].stdin.flush()
                reply = _read(procs[name])
                times[name].append(reply["s"])
                cpu[name].append(reply["cpu_s"])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait(timeout=60)
    base = names[0]
    med = {n: statistics.median(t) for n, t in times.items()}
    med_cpu = {n: statistics.median(t) for n, t in cpu.items()}
    out = {}
    for n in names:
        out[n] = {
            "flags": candidates[n],
            "median_s": round(med[n], 5),
            "speedup": round(med[base] / med[n], 3),
            "median_cpu_s": round(med_cpu[n], 5),
            "cpu_speedup": round(med_cpu[base] / med_cpu[n], 3),
            "fingerprint_rel_diff": float(f"{_diff(ready[n]['fingerprint'], ready[base]['fingerprint']):.3g}"),
            "rounds_s": [round(t, 4) for t in times[n]],
        }
        print(f"[{workload}] {n:24s} {med[n] * 1e3:8.1f} ms/block  x{out[n]['speedup']:.3f} vs {base}  "
              f"(CPU {med_cpu[n] * 1e3:8.1f} ms, x{out[n]['cpu_speedup']:.3f})  "
              f"results rel diff {out[n]['fingerprint_rel_diff']:.2e}  ({candidates[n] or 'no flags'})", flush=True)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", choices=sorted(WORKLOADS), help=argparse.SUPPRESS)
    p.add_argument("--workloads", default="ppo,lm_train,sampler,sac")
    p.add_argument("--candidate", action="append", default=[],
                   help="NAME=FLAGS (repeatable; the first is the baseline). Default: a built-in list")
    p.add_argument("--only", help="comma-separated names from the built-in list (the first is the baseline)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ppo-iters", type=int, default=4)
    p.add_argument("--cpus", default="", help="taskset core list for every child (e.g. 1); default: unpinned")
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.candidate:
        candidates = dict(c.split("=", 1) for c in args.candidate)
    elif args.only:
        candidates = {n: CANDIDATES[n] for n in args.only.split(",")}
    else:
        candidates = dict(CANDIDATES)
    print(f"cores {args.cpus or sorted(os.sched_getaffinity(0))}, rounds {args.rounds}, load {os.getloadavg()}",
          flush=True)
    result = {"benchmark": "xla_cpu_flags", "cpus": args.cpus or "all", "rounds": args.rounds,
              "load_avg_start": os.getloadavg()}
    for w in args.workloads.split(","):
        result[w] = run_workload(w, candidates, args)
    result["load_avg_end"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

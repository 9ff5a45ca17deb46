#!/usr/bin/env python
"""LM training step: ``rlinf_jax.policies.lm`` + optax vs. transformers + torch.

One step = forward, backward and an AdamW update on a batch of ``--batch`` x ``--seq``
token ids (default 32 x 128) with the causal LM objective: the mean cross-entropy of each
token given the ones before it (``T - 1`` targets per row, no padding). The model is the
one ``sampler_vs_hf.py`` uses (its ``SIZES["tiny"]``: Qwen2, hidden 256, 4 layers, 4 heads, 2 KV
heads, intermediate 512, vocabulary 2048, tied embeddings; ~2.9M parameters), built by
transformers and loaded into ours through ``save_pretrained`` / ``from_pretrained``, so both
sides start from the same float32 weights. ``--size 0.5b`` trains a random model of
Qwen2.5-0.5B's shapes instead (``sampler_vs_hf.SIZES``: 494M parameters, vocabulary
151,936), built the same way, the size people fine-tune. AdamW has the same hyperparameters on both
sides (torch's ``AdamW`` and ``optax.adamw`` decay weights the same decoupled way).

Each side in a process of its own (``side_process``: this script again, with ``--side``),
both on ONE CPU core: each process is pinned to the same core (``--cpu``, default the first
the parent may use) before torch or JAX is imported, on top of ``torch.set_num_threads(1)`` and
``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` (set by
``sampler_vs_hf``). The flags alone do not make XLA single-threaded: its CPU runtime still
runs independent ops of a step side by side on a thread pool (measured: ~1.9 cores busy on
a 2-core machine, wall time half the CPU time). Torch runs with sdpa attention
(transformers' default) and the fastest AdamW it has on CPU (``fused=True``: 1.4 ms a step
against 6 ms for the default); ours is one jitted step with donated parameters and
optimizer state.

Parity first: the first-step losses of the two sides must agree to 1e-4 (they are a few
1e-6 apart in float32), and so must the losses after two updates (the optimizers match);
otherwise the script exits with an error. Then each side is warmed up in its process (our
compile; torch's first-call costs) and the parent asks the two in turn for a timed turn of
``--steps`` steps, over ``--repeats`` turns, so load from other processes hits both alike
and they never run at once; medians over turns are reported, of
wall-clock seconds per step and of process CPU seconds per step (the steadier figure on a
shared machine; equal to wall time on an idle one, the process running on one core).

``--precision bfloat16`` runs both sides as a CPU user would in mixed precision: torch
under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (its matrix products in bfloat16
through oneDNN, on the CPU's AMX tiles where it has them), ours with bfloat16 compute
(``from_pretrained(..., dtype=bfloat16, param_dtype=float32)``); parameters and
optimizer state stay float32 on both sides. The two round differently (autocast keeps
some ops in float32), so the parity check allows 0.05 on the loss (about 0.7% of it).

``--torch-compile`` runs torch's model through ``torch.compile`` (inductor, its default
mode: forward and backward compiled by AOTAutograd, the fused AdamW eager), the way a torch
user speeds a training step up; the first steps (parity, warm-up) include its compile.

``--matmul mkl`` routes every matrix product of our step (dense layers, tied head,
attention; forward and backward) through Intel MKL (``actor.model.matmul=mkl``, the ``mkl``
extra): bfloat16 products then run on the AMX tiles, as torch's do through oneDNN.

The last line of stdout is one JSON object: the settings, both first-step losses, each
side's seconds per step, ``ratio`` = torch seconds / ours (wall clock; higher is better for
us) and ``cpu_ratio``, the same from CPU time.

    python benchmarks/train_step_vs_torch.py [--batch 32] [--seq 128] [--steps 3] [--repeats 7] [--cpu N]
    python benchmarks/train_step_vs_torch.py --precision bfloat16 [--matmul mkl]
    python benchmarks/train_step_vs_torch.py --torch-compile
    python benchmarks/train_step_vs_torch.py --size 0.5b --batch 4 --steps 1 --repeats 3 --torch-compile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pinning import pin_to_one_cpu  # noqa: E402  (no heavy imports: safe before the pinning)

if __name__ == "__main__":
    # Before torch and JAX start their thread pools: threads inherit the affinity.
    CPU = pin_to_one_cpu(sys.argv[1:])
    os.environ.setdefault("MKL_NUM_THREADS", "1")  # --matmul mkl: one thread, as the other sides (read when MKL loads)

# sampler_vs_hf sets XLA_FLAGS on import, so it must come before the first `import jax`;
# it also sets torch to one thread. Its SIZES are the models we train.
from sampler_vs_hf import SCALES, SIZES  # isort: skip
from recorded import warn_regressions  # isort: skip
import roofline  # isort: skip
from side_process import running_sides, serve, timed_in_turns  # isort: skip

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from flax import nnx

from rlinf_jax import kernels
from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import from_pretrained, set_matmul
from rlinf_jax.policies.lm.logprobs import token_logprobs
from rlinf_jax.policies.lm.tiny import tiny_hf_model

ADAMW = {"lr": 3e-4, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "weight_decay": 0.1}


def token_batch(batch: int, seq: int, vocab_size: int = SIZES["tiny"]["vocab_size"], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab_size, (batch, seq))


def torch_trainer(hf, ids: np.ndarray, precision: str = "float32", compiled: bool = False):
    """A closure running one torch training step (the model through ``torch.compile`` when
    ``compiled``); returns the step's loss (a 0-d tensor)."""
    hf.train()
    forward = torch.compile(hf) if compiled else hf
    opt = torch.optim.AdamW(
        hf.parameters(), lr=ADAMW["lr"], betas=(ADAMW["b1"], ADAMW["b2"]), eps=ADAMW["eps"],
        weight_decay=ADAMW["weight_decay"], fused=True,
    )
    inputs = torch.tensor(ids)
    targets = inputs[:, 1:].reshape(-1)

    autocast = precision == "bfloat16"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = forward(input_ids=inputs).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def causal_lm_loss(model, ids):
    """Mean cross-entropy of tokens 1..T-1 given their prefixes (all T tokens go through the
    model, as on the torch side), the way the library's SFT scores tokens: the output head
    runs on the T-1 positions that predict a token, and `token_logprobs` scores them."""
    hidden = model.hidden_states(ids)[:, :-1]
    logp, _ = token_logprobs(model.logits(hidden), ids[:, 1:], backend=model.matmul)
    return -jnp.mean(logp)


def jax_trainer(model, ids: np.ndarray, matmul: str = "xla"):
    """A closure running one jitted training step, its products through ``matmul``
    (`rlinf_jax.kernels`); returns the step's loss (a jax scalar)."""
    tx = optax.adamw(
        ADAMW["lr"], b1=ADAMW["b1"], b2=ADAMW["b2"], eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"]
    )

    def step_of(graphdef):
        def train_step(params, opt_state, ids):
            loss, grads = jax.value_and_grad(lambda p: causal_lm_loss(nnx.merge(graphdef, p), ids))(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        return jax.jit(train_step, donate_argnums=(0, 1))

    graphdef, params = nnx.split(model)
    state = {"params": params, "opt": jax.jit(tx.init)(params)}
    batch = jnp.asarray(ids, jnp.int32)
    # FLOPs are counted on the jaxpr's dots, which a custom call hides: count them on the
    # same step with XLA's products (the arithmetic is the same).
    flops = roofline.program_flops(step_of(graphdef), state["params"], state["opt"], batch)
    set_matmul(model, matmul)
    train_step = step_of(nnx.split(model)[0])

    def step():
        state["params"], state["opt"], loss = train_step(state["params"], state["opt"], batch)
        return loss

    step.flops = flops
    return step


PARITY_STEPS = 3


def build_side(side: str, args) -> tuple:
    """``(one timed turn, ready info)`` of one side (in its own process): the model built
    from the same float32 weights, its first ``PARITY_STEPS`` losses (the parity check's)
    and one untimed warm-up turn taken (our compile; torch's first-call costs)."""
    shapes = SIZES[args.size]
    hf = tiny_hf_model("qwen2", seed=0, scale=SCALES[args.size], attn_implementation="sdpa", **shapes)
    info = {"params": sum(p.numel() for p in hf.parameters())}
    ids = token_batch(args.batch, args.seq, shapes["vocab_size"])
    if side == "torch":
        step = torch_trainer(hf, ids, args.precision, args.torch_compile)
        info["versions"] = f"transformers {transformers.__version__}, torch {torch.__version__}"
        info["threads"] = torch.get_num_threads()
    else:
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d)
            model = from_pretrained(d, dtype=args.precision, param_dtype="float32")
        del hf
        step = jax_trainer(model, ids, args.matmul)
        info["flops"] = step.flops
        info["versions"] = f"jax {jax.__version__} devices {jax.devices()}"
    info["losses"] = [float(step()) for _ in range(PARITY_STEPS)]

    def turn():
        for _ in range(args.steps):
            out = step()
        float(out)  # wait for the last step (jax dispatches asynchronously)

    turn()
    return turn, info


def side_command(side: str, args) -> list[str]:
    """This script again, as the child running ``side`` on the parent's core."""
    return [sys.executable, os.path.abspath(__file__), "--side", side, "--cpu", str(CPU), "--size", args.size,
            "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
            "--precision", args.precision, "--matmul", args.matmul,
            *(["--torch-compile"] if args.torch_compile else [])]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny", help="the model's shapes (module docstring)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="training steps per timed turn")
    parser.add_argument("--repeats", type=int, default=7, help="timed turns per side")
    parser.add_argument("--cpu", type=int, help="the one CPU core to run on (default: the first this process may use)")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                        help="bfloat16: torch autocast against our bfloat16 compute, float32 parameters on both")
    parser.add_argument("--matmul", choices=kernels.BACKENDS, default="xla",
                        help="our products' backend (actor.model.matmul); mkl needs pip install -e '.[mkl]'")
    parser.add_argument("--torch-compile", action="store_true", help="torch's model through torch.compile (inductor)")
    parser.add_argument("--side", choices=("torch", "ours"), help=argparse.SUPPRESS)  # a child's side
    roofline.add_peak_argument(parser)
    args = parser.parse_args(argv)
    try:
        kernels.check_backend(args.matmul, args.precision)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.side:
        serve(*build_side(args.side, args))
        return

    # The peak first, alone on the core, before either side exists.
    peak = roofline.peak_flops_per_s(args.peak_gflops)
    with running_sides({side: side_command(side, args) for side in ("torch", "ours")}) as (sides, infos):
        torch_losses, jax_losses = infos["torch"]["losses"], infos["ours"]["losses"]
        diffs = [abs(a - b) for a, b in zip(torch_losses, jax_losses)]
        print(f"model: qwen2 ({args.size}), {infos['ours']['params'] / 1e6:.2f}M params; "
              f"batch {args.batch} x {args.seq} tokens; {args.precision}; our products: {args.matmul}; AdamW {ADAMW}")
        print(f"ours: {infos['ours']['versions']}; torch: {infos['torch']['versions']}, threads "
              f"{infos['torch']['threads']}; each side in a process of its own on core {CPU}")
        print(f"first-step loss: torch {torch_losses[0]:.7f}  ours {jax_losses[0]:.7f}  |diff| {diffs[0]:.2e}")
        print(f"loss after {PARITY_STEPS - 1} updates: torch {torch_losses[-1]:.7f}  ours {jax_losses[-1]:.7f}"
              f"  |diff| {diffs[-1]:.2e}")
        tolerance = 1e-4 if args.precision == "float32" else 0.05
        if max(diffs) > tolerance:
            raise SystemExit(f"error: losses disagree by {max(diffs):.2e} (> {tolerance:g}): the two sides do not "
                             "train the same model")
        times = timed_in_turns(sides, args.repeats)
    wall = {name: [r["wall"] / args.steps for r in runs] for name, runs in times.items()}
    cpu = {name: [r["cpu"] / args.steps for r in runs] for name, runs in times.items()}
    med = statistics.median
    for name in ("torch", "ours"):
        print(
            f"{name:<5}: {med(wall[name]) * 1e3:6.1f} ms/step wall, {med(cpu[name]) * 1e3:6.1f} ms/step CPU  "
            f"(turns, wall: {', '.join(f'{x * 1e3:.0f}' for x in wall[name])})"
        )
    result = {
        "benchmark": "train_step_vs_torch",
        "model": "qwen2",
        "size": args.size,
        "params": infos["ours"]["params"],
        "batch": args.batch,
        "seq": args.seq,
        "precision": args.precision,
        "matmul": args.matmul,
        "torch_compile": args.torch_compile,
        "peer": f"{infos['torch']['versions']}: sdpa attention, AdamW(fused=True)"
                + (", the model through torch.compile (inductor, default mode)" if args.torch_compile else ", eager")
                + (", torch.autocast bfloat16" if args.precision == "bfloat16" else ""),
        "threads": 1,
        "processes": "own",
        "pinning": f"each side in a process of its own, both on core {CPU}, timed in turns",
        "cpu_cores": [CPU],
        "first_step_loss_torch": round(torch_losses[0], 7),
        "first_step_loss_ours": round(jax_losses[0], 7),
        "first_step_loss_diff": float(f"{diffs[0]:.3g}"),
        "torch_s_per_step": round(med(wall["torch"]), 5),
        "ours_s_per_step": round(med(wall["ours"]), 5),
        "ratio": round(med(wall["torch"]) / med(wall["ours"]), 3),
        "torch_cpu_s_per_step": round(med(cpu["torch"]), 5),
        "ours_cpu_s_per_step": round(med(cpu["ours"]), 5),
        "cpu_ratio": round(med(cpu["torch"]) / med(cpu["ours"]), 3),
    }
    # Both sides do the same arithmetic (same model, batch and optimizer): one FLOP count,
    # counted on our step's jaxpr, over each side's wall time. The peak is one core's.
    ours, theirs = (roofline.rate(infos["ours"]["flops"], med(wall[name]), peak) for name in ("ours", "torch"))
    print(roofline.line("ours  FLOP/s", ours, peak))
    print(roofline.line("torch FLOP/s (same FLOP count)", theirs, peak))
    result.update(roofline.result_keys(ours, peak))
    result.update({k: v for k, v in roofline.result_keys(theirs, peak, "torch").items() if k.startswith("torch")})
    warn_regressions("train_step_vs_torch", result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

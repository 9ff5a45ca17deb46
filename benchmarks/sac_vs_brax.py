#!/usr/bin/env python
"""SAC throughput and time-to-threshold: Brax's own SAC trainer vs. ``rlinf_jax``.

By default every training run is a process of its own (``--processes own``), started as
its users start it (Brax's with the environment as it is; ours with the XLA flags
``python -m rlinf_jax.train`` sets), both pinned to the same cores (``--cpus``, default
every core this process may use), one process at a time (``--order``; ``--repeats``
alternates who goes first). ``--processes one`` runs both sides in this process with the
same XLA flags instead. Both sides take the same hyperparameters and, by default, compute
in float32 through XLA; ``--matmul mkl --compute-dtype bfloat16`` is a mixed-precision row
(ours bfloat16, Brax float32), labelled so in the JSON. For each side the script reports

* ``steady_steps_per_sec``: env steps of the training epochs after the first divided by
  their wall time (compile, the first epoch and the evaluations excluded);
* ``steady_grad_steps_per_sec``: the same for gradient steps (equal UTD on both sides, so
  the ratio is the same);
* ``compile_s``: seconds of JAX compilation (tracing, lowering, XLA), from JAX's own
  monitoring events over the whole train call;
* ``time_to_threshold_s`` and ``env_steps_to_threshold``: wall seconds from the start of
  the train call (compile included) and env steps to the first evaluation whose mean
  return is >= ``--threshold`` (``null`` if never reached).

The last line of stdout is one JSON object with both sides' figures, ``ratio`` = ours /
Brax's steady env steps/s at equal UTD (higher is better for us) and
``time_to_threshold_ratio`` = ours / Brax's (lower is better for us).

    python benchmarks/sac_vs_brax.py                   # inverted_pendulum, the sac_brax recipe's settings
    python benchmarks/sac_vs_brax.py --repeats 2 --epochs 6
    python benchmarks/sac_vs_brax.py --matmul mkl [--compute-dtype bfloat16]   # our products through MKL
    python benchmarks/sac_vs_brax.py --processes one --only ours                 # one side, in this process

Hyperparameter mapping (Brax ``sac.train`` argument -> our config key)
-----------------------------------------------------------------------
Brax's training step is one actor step of ``num_envs`` envs followed by
``grad_updates_per_step`` gradient steps; ours is the same per batched env step, and an
iteration is ``algorithm.rollout_length`` of them. An epoch (between evaluations) is
``--eval-every`` iterations, i.e. ``eval_every * rollout_length`` Brax training steps.

    num_envs                      -> env.num_envs
    grad_updates_per_step         -> algorithm.offpolicy.utd_ratio
    batch_size                    -> algorithm.offpolicy.batch_size
    learning_rate (all three)     -> actor.optim.lr = actor.optim.critic_lr
    discounting                   -> algorithm.gamma
    reward_scaling                -> algorithm.reward_scale
    tau                           -> algorithm.offpolicy.tau
    max_replay_size               -> algorithm.offpolicy.replay_size
    min_replay_size               -> algorithm.offpolicy.learning_starts
    normalize_observations        -> algorithm.normalize_observations
    (target entropy -0.5 * |A|)   -> algorithm.offpolicy.target_entropy_per_dim = -0.5
    (2 critics, 256x256 relu)     -> algorithm.offpolicy.num_q = 2, actor.model.*_hidden_sizes, activation relu
    episode_length, num_eval_envs -> env.episode_length, env.num_eval_envs
    deterministic_eval=True       -> (ours always evaluates the mode)

Differences that stay (each side as its authors wrote it): Brax fills its buffer with
``min_replay_size`` transitions of the initial policy before training, ours acts uniformly
at random for its first ``learning_starts`` transitions inside the first iteration; Brax
masks time-limit transitions out of the critic loss, ours bootstraps them from the
observation the episode ended on; Brax averages the critic loss over its two critics, ours
sums it, a constant factor that Adam's update does not see (it divides the gradient's
mean by its root mean square; only the epsilon differs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from brax_common import (  # noqa: E402
    BRAX_PMAP_AXIS,
    CompileClock,
    _install_device_put_replicated_shim,
    _summary,
    log,
    our_default_env,
    own_processes_keys,
    parse_cpus,
    run_sides,
    run_sides_in_processes,
)
from brax_common import ratio as brax_ratio  # noqa: E402
from brax_common import flops_keys, flops_per_env_step  # noqa: E402
import roofline  # noqa: E402
from recorded import warn_regressions  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--env", default="inverted_pendulum")
    p.add_argument("--backend", default="positional")
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--utd", type=int, default=32, help="gradient steps per batched env step")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--gamma", type=float, default=0.97)
    p.add_argument("--reward-scaling", type=float, default=10.0)
    p.add_argument("--tau", type=float, default=0.005)
    p.add_argument("--replay-size", type=int, default=16384)
    p.add_argument("--min-replay", type=int, default=512)
    p.add_argument("--normalize-observations", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--episode-length", type=int, default=1000)
    p.add_argument("--num-eval-envs", type=int, default=32)
    p.add_argument("--rollout-length", type=int, default=10, help="our batched env steps per iteration")
    p.add_argument("--eval-every", type=int, default=10, help="iterations per epoch (between evaluations)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--threshold", type=float, default=900.0)
    p.add_argument("--seed", type=int, default=0)
    roofline.add_peak_argument(p)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--order", choices=["brax-first", "ours-first"], default="brax-first")
    p.add_argument("--only", choices=["both", "brax", "ours"], default="both")
    p.add_argument("--processes", choices=["own", "one"], default="own",
                   help="own (default): every run in a fresh process, both pinned to --cpus; one: both sides in "
                        "this process")
    p.add_argument("--cpus", default=None,
                   help="with --processes own: the cores both sides are pinned to, e.g. 0-1 (default: every core "
                        "this process may use)")
    p.add_argument("--matmul", choices=["xla", "mkl"], default="xla",
                   help="our actor's and critics' product backend (actor.model.matmul; mkl: the mkl extra)")
    p.add_argument("--compute-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="our products' dtype (actor.model.compute_dtype); Brax's stay float32")
    args = p.parse_args(argv)
    args.steps_per_epoch = args.eval_every * args.rollout_length * args.num_envs
    args.grad_steps_per_epoch = args.eval_every * args.rollout_length * args.utd
    return args


# ------------------------------------------------------------------------------ Brax
def run_brax(args, clock) -> dict:
    import jax
    from brax import envs
    from brax.training.agents.sac import networks as sac_networks
    from brax.training.agents.sac import train as sac

    evals: list[dict] = []
    epochs: list[tuple[int, float]] = []
    prefill = -(-args.min_replay // args.num_envs) * args.num_envs
    clock.start()
    t0 = time.perf_counter()

    def progress(step, metrics):
        now = time.perf_counter()
        if "training/sps" in metrics:  # Brax's own timing of the epoch's training alone
            epochs.append((args.steps_per_epoch, args.steps_per_epoch / float(metrics["training/sps"])))
        ret = float(metrics["eval/episode_reward"])
        evals.append(dict(env_steps=int(step), wall_s=now - t0, eval_return=ret,
                          eval_s=float(metrics.get("eval/epoch_eval_time", 0.0)), compile_s=clock.total()))
        log(f"[brax] step {int(step):>9d} | wall {now - t0:7.1f} s | eval return {ret:8.2f}")

    env = envs.get_environment(args.env, backend=args.backend)
    network_factory = functools.partial(sac_networks.make_sac_networks, hidden_layer_sizes=tuple(args.hidden))
    sac.train(
        environment=env,
        num_timesteps=prefill + args.epochs * args.steps_per_epoch,
        episode_length=args.episode_length,
        num_envs=args.num_envs,
        num_eval_envs=args.num_eval_envs,
        learning_rate=args.learning_rate,
        discounting=args.gamma,
        seed=args.seed,
        batch_size=args.batch_size,
        num_evals=args.epochs + 1,
        normalize_observations=args.normalize_observations,
        reward_scaling=args.reward_scaling,
        tau=args.tau,
        min_replay_size=args.min_replay,
        max_replay_size=args.replay_size,
        grad_updates_per_step=args.utd,
        deterministic_eval=True,
        network_factory=network_factory,
        progress_fn=progress,
    )
    jax.effects_barrier()
    total = time.perf_counter() - t0
    out = _summary("brax", evals, epochs, clock.stop(), args.threshold, total)
    return _with_grad_steps(out, args)


def _with_grad_steps(out: dict, args) -> dict:
    sps = out["steady_steps_per_sec"]
    out["steady_grad_steps_per_sec"] = round(sps * args.utd / args.num_envs, 1) if sps else None
    return out


# ------------------------------------------------------------------------------ ours
def make_config(args):
    from rlinf_jax.tasks.registry import load_run_config

    return load_run_config("sac_brax", [
        f"runner.seed={args.seed}", "runner.progress_bar=false", "runner.tensorboard=false",
        f"env.name={args.env}", f"env.backend={args.backend}", f"env.num_envs={args.num_envs}",
        f"env.episode_length={args.episode_length}", f"env.num_eval_envs={args.num_eval_envs}",
        f"algorithm.rollout_length={args.rollout_length}", f"algorithm.offpolicy.utd_ratio={args.utd}",
        f"algorithm.offpolicy.batch_size={args.batch_size}", f"algorithm.offpolicy.replay_size={args.replay_size}",
        f"algorithm.offpolicy.learning_starts={args.min_replay}", f"algorithm.gamma={args.gamma}",
        f"algorithm.reward_scale={args.reward_scaling}", f"algorithm.offpolicy.tau={args.tau}",
        f"algorithm.normalize_observations={str(args.normalize_observations).lower()}",
        "algorithm.offpolicy.target_entropy_per_dim=-0.5", "algorithm.offpolicy.num_q=2",
        f"actor.model.policy_hidden_sizes=[{','.join(map(str, args.hidden))}]",
        f"actor.model.value_hidden_sizes=[{','.join(map(str, args.hidden))}]", "actor.model.activation=relu",
        f"actor.optim.lr={args.learning_rate}", f"actor.optim.critic_lr={args.learning_rate}",
        "actor.optim.max_grad_norm=0", f"actor.model.matmul={args.matmul}",
        f"actor.model.compute_dtype={args.compute_dtype}",
    ])


def run_ours(args, clock) -> dict:
    import jax

    from rlinf_jax.tasks.offpolicy.run import build_trainer

    evals: list[dict] = []
    epochs: list[tuple[int, float]] = []
    clock.start()
    t0 = time.perf_counter()
    trainer = build_trainer(make_config(args))
    ts = trainer.init()
    eval_key = jax.random.PRNGKey(args.seed + 1)
    trainer.compile(ts, eval_key)

    def do_eval(step):
        t = time.perf_counter()
        ret = float(trainer.run_eval(ts, jax.random.fold_in(eval_key, step))["eval/return"])
        now = time.perf_counter()
        evals.append(dict(env_steps=step * trainer.env_steps_per_iteration, wall_s=now - t0, eval_return=ret,
                          eval_s=now - t, compile_s=clock.total()))
        log(f"[ours] step {step * trainer.env_steps_per_iteration:>9d} | wall {now - t0:7.1f} s | eval return {ret:8.2f}")

    do_eval(0)
    step = 0
    for _ in range(args.epochs):
        t = time.perf_counter()
        ts, sums = trainer.run_iterations(ts, args.eval_every)
        trainer.summarize(sums, args.eval_every)  # blocks until the chunk is done
        epochs.append((args.steps_per_epoch, time.perf_counter() - t))
        step += args.eval_every
        do_eval(step)
    total = time.perf_counter() - t0
    compile_info = clock.stop()
    # Counted after the clock stops (tracing again must not add to compile_s), on one
    # iteration past the warm-up: a cond's costliest branch, the one with the gradient steps.
    one = (ts, trainer.algorithm.demos, jax.numpy.int32(1))
    per_step = flops_per_env_step(trainer.run_chunk, one, trainer.env_steps_per_iteration)
    flops = {"flops_per_env_step": round(per_step, 1)}
    out = _summary("ours", evals, epochs, compile_info, args.threshold, total, flops)
    return _with_grad_steps(out, args)


# ------------------------------------------------------------------------------ main
def precision(args) -> dict:
    """What each side computes in, and whether the ratio compares like with like."""
    ours = f"{args.compute_dtype} products through {'MKL' if args.matmul == 'mkl' else 'XLA'}"
    matched = args.compute_dtype == "float32"
    return {"precision": f"ours {ours}; Brax float32 products through XLA",
            "precision_matched": matched,
            **({} if matched else {"row": "mixed precision: not a like-for-like ratio"})}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.processes == "own":
        return main_own_processes(args, sys.argv[1:] if argv is None else list(argv))
    import jax

    shimmed = _install_device_put_replicated_shim(jax)
    clock = CompileClock(jax)
    log("=" * 78)
    log(f"SAC benchmark: Brax sac.train vs rlinf_jax | env {args.env} | backend {args.backend}")
    log(f"jax {jax.__version__} | devices {jax.device_count()} x {jax.devices()[0].platform} | cpu cores "
        f"{os.cpu_count()} | python {platform.python_version()}")
    if shimmed:
        log(f"note: brax needs jax.device_put_replicated, removed in this JAX; a shim on mesh axis {BRAX_PMAP_AXIS!r} "
            "was installed")
    log(f"hyperparameters: {args.num_envs} envs, {args.utd} gradient steps per batched env step, batch "
        f"{args.batch_size}, lr {args.learning_rate}, gamma {args.gamma}, reward scaling {args.reward_scaling}, "
        f"replay {args.replay_size} (min {args.min_replay}), hidden {args.hidden}, normalize obs "
        f"{args.normalize_observations}")
    log(f"our products: {args.matmul}, {args.compute_dtype} (MKL threads: {os.environ.get('MKL_NUM_THREADS', '1')})")
    log(f"schedule: {args.epochs} epochs of {args.steps_per_epoch} env steps and {args.grad_steps_per_epoch} gradient "
        f"steps per side; threshold {args.threshold:g}")
    log("=" * 78)
    schedule, results = run_sides(args, clock, run_brax, run_ours)
    ratio = functools.partial(brax_ratio, results)

    out = {
        "env": args.env, "backend": args.backend, "devices": jax.device_count(),
        "platform": jax.devices()[0].platform, "order": schedule, "threshold": args.threshold,
        "utd": args.utd, "num_envs": args.num_envs, "batch_size": args.batch_size,
        "matmul": args.matmul, "compute_dtype": args.compute_dtype, "processes": "one", **precision(args),
        "ours": results.get("ours"), "brax": results.get("brax"),
        "compile_ratio": ratio("compile_s"),
        "time_to_threshold_ratio": ratio("time_to_threshold_s"),
        "ratio": ratio("steady_steps_per_sec"),
    }
    if "ours" in results:
        out.update(flops_keys(results, roofline.peak_flops_per_s(args.peak_gflops)))
    warn_regressions("sac_vs_brax", out)
    print(json.dumps(out))
    return 0


def main_own_processes(args, argv: list[str]) -> int:
    """Each run in a process of its own, pinned alike; no JAX in this process."""
    def own_env(side):
        env = our_default_env("sac_brax") if side == "ours" else dict(os.environ)
        # JAX on the CPU on both sides: where libtpu is installed but no TPU is, JAX would
        # otherwise probe for one inside the first timed call.
        return {**env, "JAX_PLATFORMS": "cpu"}

    cpus = parse_cpus(args.cpus)
    log(f"SAC benchmark, each run in its own process on cores {cpus}: Brax sac.train vs rlinf_jax | env {args.env}")
    schedule, results = run_sides_in_processes(args, argv, os.path.abspath(__file__), own_env, cpus)
    ratio = functools.partial(brax_ratio, results)
    out = {
        "env": args.env, "backend": args.backend, "processes": "own", "order": schedule, "repeats": args.repeats,
        "threshold": args.threshold, "utd": args.utd, "num_envs": args.num_envs, "batch_size": args.batch_size,
        "matmul": args.matmul, "compute_dtype": args.compute_dtype, **precision(args),
        "ours": results.get("ours"), "brax": results.get("brax"),
        "compile_ratio": ratio("compile_s"),
        "time_to_threshold_ratio": ratio("time_to_threshold_s"),
        "ratio": ratio("steady_steps_per_sec"),
        "peer": "brax.training.agents.sac.train.train with its defaults for everything the mapping in this script's "
                "docstring does not set; its own process, the environment as it is",
    }
    out.update(own_processes_keys(results, cpus, args.peak_gflops))
    if "ours" in results and "brax" in results:
        log(f"ratio (ours/brax steady env steps/s, own processes, {out['precision']}): {out['ratio']} | "
            f"time_to_threshold_ratio: {out['time_to_threshold_ratio']} | compile_ratio: {out['compile_ratio']}")
    warn_regressions("sac_vs_brax", out)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

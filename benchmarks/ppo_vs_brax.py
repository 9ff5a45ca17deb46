#!/usr/bin/env python
"""PPO throughput and time-to-threshold: Brax's own PPO trainer vs. ``rlinf_jax``.

By default every training run is a process of its own (``--processes own``), started as
each side's users start it: Brax's with the environment as it is, ours with the XLA flags
``python -m rlinf_jax.train`` sets. Neither side finds the other's programs compiled or
its caches warm. Both use every core of the machine, on the same env (``brax.envs``),
backend and devices, with the same hyperparameters, in a fixed order (``--order``; with
``--repeats`` the order alternates, and each figure is the median over its side's runs).
``--processes one`` runs both sides in this process with the same XLA flags instead; there
the second side finds the first one's setup programs compiled (a warmer start).
For each side the script reports

* ``steady_steps_per_sec``: env steps of the training epochs/chunks after the first
  divided by their wall time (compile, the first epoch and all evaluations excluded);
* ``compile_s``: seconds spent compiling (JAX tracing + lowering + XLA backend compile),
  summed from JAX's own monitoring events over the whole train call, so the same
  measure applies to both sides (for ours ``aot_compile_s`` is also given: the wall time
  of ``run_chunk.lower(...).compile()`` plus ``evaluate.lower(...).compile()``);
* ``time_to_threshold_s``: wall seconds from the start of the train call (env
  construction included, hence compile included) to the end of the first evaluation
  whose mean return is >= ``--threshold`` (``null`` if never reached).

The last line of stdout is one JSON object with both sides' figures plus ``ratio`` =
ours / Brax's steady steps/s (higher is better for us) and ``time_to_threshold_ratio``
= ours / Brax's time to threshold (lower is better for us). Everything before it is
human-readable progress.

Examples::

    python benchmarks/ppo_vs_brax.py --repeats 3              # inverted_pendulum, A B A B A B, medians
    python benchmarks/ppo_vs_brax.py --env ant                # ant on mjx, scaled to a CPU
    python benchmarks/ppo_vs_brax.py --processes one --devices 2 --only ours  # 2 forced host devices

Hyperparameter mapping (Brax ``ppo.train`` argument -> our config key)
-----------------------------------------------------------------------
Brax collects, per training step, ``batch_size * num_minibatches / num_envs`` sequential
unrolls of ``unroll_length`` steps for every env, splits them into ``num_minibatches``
minibatches of ``batch_size`` unroll segments and runs ``num_updates_per_batch`` epochs.
Ours rolls out ``algorithm.rollout_length`` (T) steps per env per iteration, runs GAE
over all T and shuffles flat transitions into minibatches. With

    T = unroll_length * batch_size * num_minibatches / num_envs

one Brax training step and one of our iterations use the same number of env steps and
the same number of transitions per minibatch (``batch_size * unroll_length``).

    num_envs                     -> env.num_envs
    unroll_length, batch_size    -> algorithm.rollout_length (T above)
    num_minibatches              -> algorithm.num_minibatches
    num_updates_per_batch        -> algorithm.update_epochs
    discounting                  -> algorithm.gamma
    gae_lambda                   -> algorithm.gae_lambda
    clipping_epsilon             -> algorithm.clip_eps
    entropy_cost                 -> algorithm.entropy_coef
    vf_loss_coefficient (0.5)    -> algorithm.value_coef (0.5)
    reward_scaling               -> algorithm.reward_scale
    normalize_observations       -> algorithm.normalize_observations
    normalize_advantage (True)   -> algorithm.normalize_advantages (True)
    (time limits, see below)     -> algorithm.bootstrap_on_truncation=True
    learning_rate                -> actor.optim.lr (constant schedule both)
    max_grad_norm                -> actor.optim.max_grad_norm
    episode_length               -> env.episode_length
    action_repeat                -> env.action_repeat
    num_eval_envs                -> env.num_eval_envs
    network_factory=partial(make_ppo_networks, policy_hidden_layer_sizes=P,
        value_hidden_layer_sizes=V)  -> actor.model.policy_hidden_sizes=P / value_hidden_sizes=V
    (activation swish is both defaults)
    deterministic_eval=True      -> (ours always evaluates the deterministic policy)
    seed                         -> runner.seed
    num_evals                    -> evaluation cadence: one eval every ``--eval-every``
                                    iterations (plus one at step 0, as Brax does)

Evaluation cadence: Brax's ``num_evals = n_epochs + 1`` (an eval at step 0, then one
after each epoch of ``--eval-every`` training steps, i.e. ``num_timesteps = n_epochs *
eval_every * env_steps_per_iteration``); ours runs ``run_chunk`` with
``n = eval_every`` iterations between evaluations and also evaluates at step 0.

Time limits: ours bootstraps ``V(final observation)`` on a time-limit step
(``bootstrap_on_truncation=True``, our default). Brax's default
(``bootstrap_on_timeout=False``) masks time-limit steps out of GAE using its
``EpisodeWrapper``'s ``truncation`` flag, which is Brax's correct treatment of a time
limit, so that is what the benchmark passes by default. Brax's ``bootstrap_on_timeout=True``
is NOT used by default because in brax 0.14.2 it (a) reads ``state.info["time_out"]``,
which only ``inverted_pendulum`` sets, and sets it to ``done``, i.e. on every *fall*
(a termination), not on the time limit; (b) adds ``gamma * V(s_t)`` (value of the
current, not the final observation) to the raw reward, which ``reward_scaling`` then
multiplies again: with reward_scaling=10 the value target feeds back on itself and
Brax's value loss diverged (1e9 after 5 iterations, 4e19 after 30; eval return stuck at
~43 while it reaches 1000 without the flag). ``--brax-bootstrap-on-timeout`` passes it
anyway (inverted_pendulum only; other envs lack ``time_out``).

Other algorithmic differences that remain (not hyperparameters): Brax updates the
observation normaliser before the SGD epochs, ours after; Brax's evaluation always
steps ``episode_length`` steps, ours stops once every eval episode has ended (cheaper
while the policy still falls early; equal once it survives); Brax shuffles unroll
segments of ``unroll_length`` steps, ours single transitions; Brax computes no value
during the rollout (without ``bootstrap_on_timeout``), neither does ours.

Noise: this is meant for a shared machine. ``--repeats R`` runs each side R times in
one process, alternating which side goes first (A B, B A, ...); the summary takes the
median over repeats and keeps every run. Steady-state steps/s is also reported as the
median over epochs (``steady_steps_per_sec_median_epoch``), which resists a burst of
load better than the aggregate.

Compatibility shim: brax 0.14.2 calls ``jax.device_put_replicated``, which JAX 0.10
removed. ``_install_device_put_replicated_shim`` puts back an equivalent built from
public APIs (see there); the script prints a line when it is installed.

Only ``rlinf_jax`` library APIs are used for our side (``Config``, ``build_trainer``,
the fused runner's ``init / run_chunk / evaluate / summarize``); not the CLI or run directory.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
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
    flops_keys,
    flops_per_env_step,
    log,
    our_default_env,
    own_processes_keys,
    parse_cpus,
    run_sides,
    run_sides_in_processes,
)
from brax_common import ratio as brax_ratio  # noqa: E402
import roofline  # noqa: E402
from recorded import warn_regressions  # noqa: E402

# --------------------------------------------------------------------------- defaults
# Per-env defaults; every entry can be overridden on the command line.
ENV_DEFAULTS = {
    # Brax's own inverted_pendulum recipe (reward_scaling 10, unroll 5, epochs 4, ...),
    # scaled from 2048 envs down to 128 for a CPU. T = 5 * 128 * 16 / 128 = 80.
    "inverted_pendulum": dict(
        backend="positional",
        threshold=950.0,
        max_env_steps=300_000,
        eval_every=5,
        num_envs=128,
        unroll_length=5,
        batch_size=128,
        num_minibatches=16,
        update_epochs=4,
        gamma=0.97,
        gae_lambda=0.95,
        clip_eps=0.3,
        entropy_cost=1e-2,
        learning_rate=3e-4,
        reward_scaling=10.0,
        max_grad_norm=1.0,
        episode_length=1000,
        action_repeat=1,
        num_eval_envs=128,
        policy_hidden=[32, 32, 32, 32],
        value_hidden=[256, 256, 256, 256, 256],
    ),
    # Brax's ant recipe (mjx; unroll 5, 4 epochs, gamma .97, lr 3e-4, entropy 1e-2,
    # reward_scaling 10, episode 1000, 128 eval envs) with 4096 envs / batch 2048 / 32
    # minibatches scaled down to 128 envs / batch 64 / 16 minibatches:
    # T = 5 * 64 * 16 / 128 = 40, i.e. 5120 env steps per iteration. 600k steps is what
    # fits in ~10 minutes for both sides on 2 CPU cores (about 14k steps/s, 40-60 s of
    # compile per side, 5 s per 128-env eval). Ant's deterministic eval return starts near
    # 800-950 (healthy reward of a standing ant) and is noisy; 1000 is a threshold these
    # short runs can reach, not a measure of a trained ant.
    "ant": dict(
        backend="mjx",
        threshold=1000.0,
        max_env_steps=614_400,
        eval_every=10,
        num_envs=128,
        unroll_length=5,
        batch_size=64,
        num_minibatches=16,
        update_epochs=4,
        gamma=0.97,
        gae_lambda=0.95,
        clip_eps=0.3,
        entropy_cost=1e-2,
        learning_rate=3e-4,
        reward_scaling=10.0,
        max_grad_norm=1.0,
        episode_length=1000,
        action_repeat=1,
        num_eval_envs=128,
        policy_hidden=[32, 32, 32, 32],
        value_hidden=[256, 256, 256, 256, 256],
    ),
}
# Fallback for any other brax env name.
ENV_DEFAULTS_OTHER = dict(ENV_DEFAULTS["ant"], backend="positional")

# brax.training.agents.ppo.train._PMAP_AXIS_NAME (checked against it in run_brax).
def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.replace("[", "").replace("]", "").split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="inverted_pendulum", help="a brax.envs name")
    p.add_argument("--backend", help="brax backend (default: per env; inverted_pendulum=positional, ant=mjx)")
    p.add_argument("--threshold", type=float, help="eval return to reach (default: per env)")
    p.add_argument("--max-env-steps", type=int, help="training env steps per side (rounded up to whole evals)")
    p.add_argument("--eval-every", type=int, help="training iterations between evaluations")
    p.add_argument("--only", choices=("both", "ours", "brax"), default="both")
    p.add_argument(
        "--order",
        choices=("brax-first", "ours-first"),
        default="brax-first",
        help="which side runs first (in the first repeat; later repeats alternate)",
    )
    p.add_argument("--repeats", type=int, default=1, help="runs per side, alternating the order")
    p.add_argument("--cpus", default=None,
                   help="with --processes own: the cores both sides are pinned to, e.g. 0-1 (default: every core "
                        "this process may use)")
    p.add_argument(
        "--processes",
        choices=("one", "own"),
        default="own",
        help="own (default): every run in a fresh process with its side's own defaults (Brax: the environment as "
        "it is; ours: what rlinf_jax.train sets); one: both sides in this process with the same XLA flags",
    )
    p.add_argument(
        "--brax-bootstrap-on-timeout",
        action="store_true",
        help="pass bootstrap_on_timeout=True to Brax (diverges in brax 0.14.2; see the docstring)",
    )
    p.add_argument(
        "--no-bootstrap-on-truncation",
        dest="bootstrap_on_truncation",
        action="store_false",
        default=True,
        help="ours: do not bootstrap V(final obs) on time limits",
    )
    p.add_argument("--seed", type=int, default=0)
    roofline.add_peak_argument(p)
    p.add_argument("--devices", type=int, help="force N host devices (sets XLA_FLAGS before importing jax)")
    p.add_argument("--num-envs", type=int)
    p.add_argument("--unroll-length", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--num-minibatches", type=int)
    p.add_argument("--update-epochs", type=int, help="Brax num_updates_per_batch")
    p.add_argument("--gamma", type=float)
    p.add_argument("--gae-lambda", type=float)
    p.add_argument("--clip-eps", type=float)
    p.add_argument("--entropy-cost", type=float)
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--reward-scaling", type=float)
    p.add_argument("--max-grad-norm", type=float)
    p.add_argument("--episode-length", type=int)
    p.add_argument("--action-repeat", type=int)
    p.add_argument("--num-eval-envs", type=int)
    p.add_argument("--policy-hidden", type=_int_list, help="e.g. 32,32,32,32")
    p.add_argument("--value-hidden", type=_int_list, help="e.g. 256,256,256,256,256")
    p.add_argument(
        "--no-normalize-observations", dest="normalize_observations", action="store_false", default=True
    )
    args = p.parse_args(argv)
    for k, v in ENV_DEFAULTS.get(args.env, ENV_DEFAULTS_OTHER).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    rows = args.unroll_length * args.batch_size * args.num_minibatches
    if rows % args.num_envs:
        p.error(
            f"unroll_length*batch_size*num_minibatches = {rows} must be divisible by num_envs={args.num_envs}"
        )
    args.rollout_length = rows // args.num_envs
    args.steps_per_iter = rows * args.action_repeat
    # Whole evaluation epochs of `eval_every` iterations, at least two (the first one
    # carries Brax's compile, so steady state needs a second).
    args.num_epochs = max(2, math.ceil(args.max_env_steps / (args.steps_per_iter * args.eval_every)))
    args.total_iters = args.num_epochs * args.eval_every
    args.total_env_steps = args.total_iters * args.steps_per_iter
    return args


# ------------------------------------------------------------------------- JAX setup
# ------------------------------------------------------------------------------ Brax
def run_brax(args, clock) -> dict:
    import jax
    from brax import envs
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as ppo

    if getattr(ppo, "_PMAP_AXIS_NAME", BRAX_PMAP_AXIS) != BRAX_PMAP_AXIS:
        log(f"[brax] warning: brax's pmap axis is {ppo._PMAP_AXIS_NAME!r}, the shim uses {BRAX_PMAP_AXIS!r}")
    steps_per_epoch = args.eval_every * args.steps_per_iter
    evals: list[dict] = []
    epochs: list[tuple[int, float]] = []

    clock.start()
    t0 = time.perf_counter()

    def progress(step, metrics):
        wall = time.perf_counter() - t0
        ret = float(metrics["eval/episode_reward"])
        eval_s = float(metrics["eval/epoch_eval_time"]) if "eval/epoch_eval_time" in metrics else None
        sps = metrics.get("training/sps")
        if sps is not None:
            epochs.append((steps_per_epoch, steps_per_epoch / float(sps)))
        evals.append(dict(env_steps=int(step), wall_s=wall, eval_return=ret, eval_s=eval_s, compile_s=clock.total()))
        ep = f" | epoch {epochs[-1][1]:.2f} s = {float(sps):.0f} steps/s" if sps is not None else ""
        log(f"[brax] step {int(step):>9d} | wall {wall:7.1f} s | eval return {ret:8.2f} (eval {eval_s or 0:.2f} s){ep}")

    env = envs.get_environment(args.env, backend=args.backend)
    network_factory = functools.partial(
        ppo_networks.make_ppo_networks,
        policy_hidden_layer_sizes=tuple(args.policy_hidden),
        value_hidden_layer_sizes=tuple(args.value_hidden),
    )
    ppo.train(
        environment=env,
        num_timesteps=args.total_env_steps,
        num_envs=args.num_envs,
        episode_length=args.episode_length,
        action_repeat=args.action_repeat,
        learning_rate=args.learning_rate,
        entropy_cost=args.entropy_cost,
        discounting=args.gamma,
        unroll_length=args.unroll_length,
        batch_size=args.batch_size,
        num_minibatches=args.num_minibatches,
        num_updates_per_batch=args.update_epochs,
        normalize_observations=args.normalize_observations,
        reward_scaling=args.reward_scaling,
        clipping_epsilon=args.clip_eps,
        gae_lambda=args.gae_lambda,
        max_grad_norm=args.max_grad_norm,
        normalize_advantage=True,
        vf_loss_coefficient=0.5,
        bootstrap_on_timeout=args.brax_bootstrap_on_timeout,
        network_factory=network_factory,
        seed=args.seed,
        num_evals=args.num_epochs + 1,
        num_eval_envs=args.num_eval_envs,
        deterministic_eval=True,
        progress_fn=progress,
    )
    jax.effects_barrier()
    total = time.perf_counter() - t0
    compile_info = clock.stop()
    if len(epochs) != args.num_epochs:
        log(f"[brax] warning: expected {args.num_epochs} training epochs, saw {len(epochs)}")
    return _summary("brax", evals, epochs, compile_info, args.threshold, total)


# ------------------------------------------------------------------------------ ours
def _build_trainer(cfg):
    from rlinf_jax.tasks.embodied.build import build_trainer

    return build_trainer(cfg)


def make_config(args):
    from rlinf_jax.config.schema import Config

    cfg = Config()
    cfg.runner.seed = args.seed
    cfg.runner.max_steps = args.total_iters
    cfg.runner.eval_interval = args.eval_every
    cfg.runner.progress_bar = False
    cfg.runner.tensorboard = False
    cfg.env.suite = "brax"
    cfg.env.name = args.env
    cfg.env.backend = args.backend
    cfg.env.num_envs = args.num_envs
    cfg.env.episode_length = args.episode_length
    cfg.env.action_repeat = args.action_repeat
    cfg.env.num_eval_envs = args.num_eval_envs
    cfg.env.reset_mode = "cached"  # Brax's AutoResetWrapper replays each env's first state
    a = cfg.algorithm
    a.rollout_length = args.rollout_length
    a.update_epochs = args.update_epochs
    a.num_minibatches = args.num_minibatches
    a.gamma = args.gamma
    a.gae_lambda = args.gae_lambda
    a.clip_eps = args.clip_eps
    a.entropy_coef = args.entropy_cost
    a.value_coef = 0.5
    a.reward_scale = args.reward_scaling
    a.normalize_advantages = True
    a.normalize_observations = args.normalize_observations
    a.bootstrap_on_truncation = args.bootstrap_on_truncation
    m = cfg.actor.model
    m.policy_hidden_sizes = list(args.policy_hidden)
    m.value_hidden_sizes = list(args.value_hidden)
    m.activation = "swish"
    o = cfg.actor.optim
    o.lr = args.learning_rate
    o.max_grad_norm = args.max_grad_norm
    o.lr_schedule = "constant"
    cfg.cluster.num_devices = "all"
    return cfg


def run_ours(args, clock) -> dict:
    import jax
    import jax.numpy as jnp

    # Loaded before the clock starts, as run_brax loads Brax's trainer: both sides' times
    # run from the train call, not from the imports.
    import rlinf_jax.config.schema  # noqa: F401
    import rlinf_jax.tasks.embodied.build  # noqa: F401

    evals: list[dict] = []
    epochs: list[tuple[int, float]] = []

    clock.start()
    t0 = time.perf_counter()
    cfg = make_config(args)
    trainer = _build_trainer(cfg)
    assert trainer.env_steps_per_iteration == args.steps_per_iter, (
        trainer.env_steps_per_iteration,
        args.steps_per_iter,
    )
    ts = trainer.init()
    t_setup = time.perf_counter() - t0
    tc = time.perf_counter()
    chunk = trainer.run_chunk.lower(ts, jnp.int32(1)).compile()
    t_chunk_compile = time.perf_counter() - tc
    eval_key = jax.random.PRNGKey(args.seed + 1)
    te = time.perf_counter()
    evaluate = trainer.evaluate.lower(ts.params, ts.obs_stats, eval_key).compile()
    t_eval_compile = time.perf_counter() - te
    log(
        f"[ours] setup (env, trainer, init) {t_setup:.2f} s | AOT compile: run_chunk {t_chunk_compile:.2f} s, "
        f"evaluate {t_eval_compile:.2f} s"
    )

    def do_eval(step: int):
        t = time.perf_counter()
        ev = evaluate(ts.params, ts.obs_stats, jax.random.fold_in(eval_key, step))
        ret = float(ev["eval/return"])  # blocks
        eval_s = time.perf_counter() - t
        wall = time.perf_counter() - t0
        evals.append(
            dict(
                env_steps=step * trainer.env_steps_per_iteration,
                wall_s=wall,
                eval_return=ret,
                eval_s=eval_s,
                compile_s=clock.total(),
            )
        )
        return wall, ret, eval_s

    wall, ret, eval_s = do_eval(0)
    log(f"[ours] step {0:>9d} | wall {wall:7.1f} s | eval return {ret:8.2f} (eval {eval_s:.2f} s)")
    step = 0
    n = args.eval_every
    for _ in range(args.num_epochs):
        t = time.perf_counter()
        ts, sums = chunk(ts, jnp.int32(n))
        metrics = trainer.summarize(sums, n)  # blocks until the chunk is done
        dt = time.perf_counter() - t
        step += n
        epochs.append((n * trainer.env_steps_per_iteration, dt))
        wall, ret, eval_s = do_eval(step)
        train_ret = f"{metrics['env/return']:.1f}" if "env/return" in metrics else "n/a (no episode ended)"
        log(
            f"[ours] step {step * trainer.env_steps_per_iteration:>9d} | wall {wall:7.1f} s | eval return "
            f"{ret:8.2f} (eval {eval_s:.2f} s) | epoch {dt:.2f} s = "
            f"{n * trainer.env_steps_per_iteration / dt:.0f} steps/s | train return {train_ret}"
        )
    total = time.perf_counter() - t0
    compile_info = clock.stop()
    # Counted after the clock stops: tracing the chunk again must not add to compile_s.
    flops = flops_per_env_step(trainer.run_chunk, (ts, jnp.int32(1)), trainer.env_steps_per_iteration)
    extra = {
        "flops_per_env_step": round(flops, 1),
        "aot_compile_s": round(t_chunk_compile + t_eval_compile, 3),
        "aot_compile_run_chunk_s": round(t_chunk_compile, 3),
        "aot_compile_evaluate_s": round(t_eval_compile, 3),
        "setup_s": round(t_setup, 3),
    }
    return _summary("ours", evals, epochs, compile_info, args.threshold, total, extra)


# ------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.processes == "own":
        return main_own_processes(args, sys.argv[1:] if argv is None else list(argv))
    if args.devices:
        flags = os.environ.get("XLA_FLAGS", "")
        flags = " ".join(f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count"))
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={args.devices}".strip()
    if "jax" in sys.modules and args.devices:
        log("warning: jax was imported before --devices could take effect")

    import jax

    shimmed = _install_device_put_replicated_shim(jax)
    clock = CompileClock(jax)

    log("=" * 78)
    log(f"PPO benchmark: Brax ppo.train vs rlinf_jax | env {args.env} | backend {args.backend}")
    log(
        f"jax {jax.__version__} | devices {jax.device_count()} x {jax.devices()[0].platform} | "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} | cpu cores {os.cpu_count()} | python {platform.python_version()}"
    )
    if shimmed:
        log(
            "note: jax.device_put_replicated was removed in this JAX; a compatibility shim "
            f"(NamedSharding over the devices on mesh axis {BRAX_PMAP_AXIS!r}, one slice per device) was "
            "installed for brax's ppo.train"
        )
    log(
        f"hyperparameters: num_envs {args.num_envs}, unroll_length {args.unroll_length}, batch_size "
        f"{args.batch_size}, num_minibatches {args.num_minibatches}, epochs {args.update_epochs} -> our "
        f"rollout_length {args.rollout_length}; {args.steps_per_iter} env steps/iteration, "
        f"{args.batch_size * args.unroll_length} transitions/minibatch"
    )
    log(
        f"gamma {args.gamma}, lambda {args.gae_lambda}, clip {args.clip_eps}, entropy {args.entropy_cost}, "
        f"lr {args.learning_rate}, reward_scaling {args.reward_scaling}, normalize_obs "
        f"{args.normalize_observations}, max_grad_norm {args.max_grad_norm}, episode_length "
        f"{args.episode_length}, action_repeat {args.action_repeat}, eval envs {args.num_eval_envs}, "
        f"policy {args.policy_hidden}, value {args.value_hidden}"
    )
    log(
        f"schedule: {args.num_epochs} epochs x {args.eval_every} iterations = {args.total_iters} iterations = "
        f"{args.total_env_steps} env steps per side; eval at step 0 and after every epoch; "
        f"threshold {args.threshold:g}"
    )
    log(
        f"time limits: brax bootstrap_on_timeout={args.brax_bootstrap_on_timeout} (masks truncated steps), "
        f"ours bootstrap_on_truncation={args.bootstrap_on_truncation}"
    )
    log("=" * 78)
    schedule, results = run_sides(args, clock, run_brax, run_ours)
    ratio = functools.partial(brax_ratio, results)

    out = {
        "env": args.env,
        "backend": args.backend,
        "processes": "one",
        "devices": jax.device_count(),
        "platform": jax.devices()[0].platform,
        "order": schedule,
        "repeats": args.repeats,
        "threshold": args.threshold,
        "env_steps_per_side": args.total_env_steps,
        "env_steps_per_iteration": args.steps_per_iter,
        "eval_every_iterations": args.eval_every,
        "device_put_replicated_shim": shimmed,
        "brax_bootstrap_on_timeout": args.brax_bootstrap_on_timeout,
        "ours_bootstrap_on_truncation": args.bootstrap_on_truncation,
        "ours": results.get("ours"),
        "brax": results.get("brax"),
        "compile_ratio": ratio("compile_s"),
        "ratio_median_epoch": ratio("steady_steps_per_sec_median_epoch"),
        "ratio": ratio("steady_steps_per_sec"),
        "time_to_threshold_ratio": ratio("time_to_threshold_s"),
    }
    if "ours" in results:
        out.update(flops_keys(results, roofline.peak_flops_per_s(args.peak_gflops)))
    # Only one side reached the threshold: the ratio is bounded by that side's time over
    # the other side's whole train call (it would have needed at least that long).
    o, bx = results.get("ours") or {}, results.get("brax") or {}
    if o.get("time_to_threshold_s") is not None and bx and bx.get("time_to_threshold_s") is None:
        out["time_to_threshold_ratio_upper_bound"] = round(o["time_to_threshold_s"] / bx["train_call_wall_s"], 3)
    if bx.get("time_to_threshold_s") is not None and o and o.get("time_to_threshold_s") is None:
        out["time_to_threshold_ratio_lower_bound"] = round(o["train_call_wall_s"] / bx["time_to_threshold_s"], 3)
    if "ours" in results and "brax" in results:
        log(
            f"ratio (ours/brax steady steps/s, higher is better): {out['ratio']} "
            f"(median-epoch ratio {out['ratio_median_epoch']}) | time_to_threshold_ratio (ours/brax, lower "
            f"is better): {out['time_to_threshold_ratio']} | compile_ratio (ours/brax): {out['compile_ratio']}"
        )
    warn_regressions("ppo_vs_brax", out)
    print(json.dumps(out), flush=True)
    return 0


def main_own_processes(args, argv: list[str]) -> int:
    """Each run in its own process, each side with its own defaults: what a Brax user and
    a rlinf_jax user each see. No JAX in this process."""
    def own_env(side):
        return our_default_env("ppo_brax") if side == "ours" else dict(os.environ)

    log(f"PPO benchmark, each run in its own process: Brax ppo.train vs rlinf_jax | env {args.env}")
    cpus = parse_cpus(args.cpus)
    schedule, results = run_sides_in_processes(args, argv, os.path.abspath(__file__), own_env, cpus)
    ratio = functools.partial(brax_ratio, results)
    out = {
        "env": args.env, "backend": args.backend, "processes": "own", "order": schedule, "repeats": args.repeats,
        "threshold": args.threshold, "env_steps_per_side": args.total_env_steps,
        "ours": results.get("ours"), "brax": results.get("brax"),
        "compile_ratio": ratio("compile_s"),
        "ratio_median_epoch": ratio("steady_steps_per_sec_median_epoch"),
        "ratio": ratio("steady_steps_per_sec"),
        "time_to_threshold_ratio": ratio("time_to_threshold_s"),
        "peer": "brax.training.agents.ppo.train.train with its defaults for everything the mapping above does "
                "not set; its own process, the environment as it is",
        "precision": "float32 on both sides",
    }
    out.update(own_processes_keys(results, cpus, args.peak_gflops))
    if "ours" in results and "brax" in results:
        log(f"ratio (ours/brax steady steps/s, own processes): {out['ratio']} | time_to_threshold_ratio: "
            f"{out['time_to_threshold_ratio']} | compile_ratio: {out['compile_ratio']}")
    warn_regressions("ppo_vs_brax", out)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Supervised fine-tuning of a VLA policy on the tabletop's expert demonstrations, as a run of
its own (``runner.task=sft`` with ``actor.model.kind=vla``; recipe ``sft_vla_tabletop``).

The run has the shape of an embodied run: the same model, run directory, checkpoints,
per-split evaluation (``eval/success/<split>``) and host loop; an iteration is one
behaviour-cloning step (`vla_bc.bc_loss` on a minibatch of demonstration steps) instead of a
PPO iteration. Its checkpoints hold the embodied `TrainState` with the cloning optimiser's
state, so an RL run starts from it with ``actor.model.path=<this run>`` and reads only the
parameters (`load_params`).

With ``sft.dagger_rounds`` > 0 the run aggregates DAgger data (`vla_bc.dagger_data`) at
evenly spaced steps (``k * max_steps / (rounds + 1)``): the current policy plays
``sft.dagger_episodes`` training episodes, the expert labels the states it visited, and
cloning continues on the demos plus every round so far. A resumed run re-collects the
rounds before its step with the restored policy (the data is not checkpointed).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow import vla_bc
from rlinf_jax.flow.embodied_ppo import PPOTrainer, TrainState
from rlinf_jax.flow.host_loop import HostLoop, enable_compilation_cache, open_run_dir
from rlinf_jax.sharding.mesh import fetch


def bc_optimizer(cfg: Config):
    return optax.chain(optax.clip_by_global_norm(cfg.actor.optim.max_grad_norm), optax.adam(cfg.sft.lr))


class VLASFTTrainer:
    """Behaviour cloning on the demonstrations, with a `PPOTrainer` for the model, state
    layout and evaluation (its warm start is off: the cloning is this run)."""

    def __init__(self, cfg: Config, core: PPOTrainer):
        self.cfg, self.core = cfg, core
        self.policy, self.graphdef = core.policy, core.graphdef
        self.tx = bc_optimizer(cfg)
        self.data = None
        self.auto_plan = None

    # --------------------------------------------------------------- state
    def init(self) -> TrainState:
        ts = self.core.init()
        return ts.replace(opt_state=self.tx.init(ts.params))

    def start(self, ts: TrainState) -> TrainState:
        return self.core.place(ts)

    def snapshot(self, ts: TrainState) -> TrainState:
        return ts

    def progress(self, ts: TrainState) -> tuple[int, int]:
        return int(ts.step), int(ts.bad_iterations)

    # ------------------------------------------------------------ training
    def load_demos(self) -> None:
        sft, seed = self.cfg.sft, self.cfg.runner.seed
        data = vla_bc.expert_demos(self.core.env, sft.num_demos, seed)
        self.num_examples = len(data["action"])
        self.batch_size = min(sft.batch_size, self.num_examples)
        self.dagger_steps_at = self._dagger_schedule()
        if not self.dagger_steps_at:
            self.data = vla_bc.bc_arrays(self.policy, data)
            self.rows = None  # every step draws distinct demo steps, as without DAgger before
        else:
            self.capacity = vla_bc.dagger_capacity(
                self.core.env, self.num_examples, len(self.dagger_steps_at), sft.dagger_episodes
            )
            self.demos = {k: data[k] for k in ("image", "tokens", "proprio", "action")}
            self.data = vla_bc.pad_steps(self.policy, self.demos, self.capacity)
            self.rows = jnp.int32(self.num_examples)
            self._visit = vla_bc.policy_visitor(self.core.env, self.policy, self.graphdef, greedy=True)
        self.rounds_done = 0

        def steps(ts: TrainState, n, data, rows):
            def step(i, carry):
                ts, loss_sum, acc_sum = carry
                key = jax.random.fold_in(ts.key, ts.step)  # a resumed run draws what it would have
                params, opt_state, loss, acc = vla_bc.bc_step(
                    self.policy, self.graphdef, self.tx, data, self.batch_size, ts.params, ts.opt_state, key,
                    rows=rows,
                )
                ts = ts.replace(params=params, opt_state=opt_state, step=ts.step + 1)
                return ts, loss_sum + loss, acc_sum + acc

            zero = jnp.zeros((), jnp.float32)
            ts, loss, acc = jax.lax.fori_loop(0, n, step, (ts, zero, zero))
            return ts, {"train/bc_loss": loss / n, "train/bin_accuracy": acc / n}

        self._steps = jax.jit(steps, donate_argnums=0)

    def _dagger_schedule(self) -> list[int]:
        """The steps at which DAgger rounds collect data (empty without DAgger)."""
        sft, total = self.cfg.sft, self.cfg.runner.max_steps
        return [total * k // (sft.dagger_rounds + 1) for k in range(1, sft.dagger_rounds + 1)]

    def _dagger_round(self, ts: TrainState) -> None:
        """Adds one round of the current policy's visited states, labelled by the expert."""
        r = self.rounds_done = self.rounds_done + 1
        new, success = vla_bc.dagger_data(
            self.core.env, self._visit, ts.params, self.cfg.sft.dagger_episodes, self.cfg.runner.seed * 1000 + r
        )
        self.demos = {k: np.concatenate([self.demos[k], new[k]]) for k in self.demos}
        self.data = vla_bc.pad_steps(self.policy, self.demos, self.capacity)
        self.rows = jnp.int32(len(self.demos["action"]))
        self.dagger_metrics = {"sft/dagger_success": success, "sft/demo_steps": float(self.rows)}

    def run_iterations(self, ts: TrainState, n: int):
        """``n`` cloning steps; a DAgger round falling inside them runs where it is due."""
        metrics, done, step = None, 0, int(ts.step)
        self.dagger_metrics = {}
        while done < n:
            due = [s for s in self.dagger_steps_at[self.rounds_done :] if s <= step]
            if due:
                self._dagger_round(ts)
                continue
            upcoming = [s for s in self.dagger_steps_at[self.rounds_done :] if s > step]
            k = min(n - done, (upcoming[0] - step) if upcoming else n - done)
            ts, part = self._steps(ts, jnp.int32(k), self.data, self.rows)
            part = {key: v * k for key, v in part.items()}  # sums, averaged over n below
            metrics = part if metrics is None else {key: metrics[key] + part[key] for key in part}
            done, step = done + k, step + k
        return ts, {**{key: v / n for key, v in metrics.items()}, **self.dagger_metrics}

    def run_eval(self, ts: TrainState, key) -> dict:
        return self.core.evaluate(ts.params, ts.obs_stats, key)


class VLASFTLoop(HostLoop):
    label = "sft"
    shown = {"train/bc_loss": "loss", "eval/success": "success"}
    eval_metric = "eval/success"
    unit = "steps"
    diverged_hint = "Lower sft.lr"

    def compile(self, state) -> None:
        self.trainer.load_demos()

    def first_record(self, state) -> dict:
        return {
            "time/demo_sec": self.compile_sec,
            "sft/demo_steps": self.trainer.num_examples,
            **self.evaluate(state, 0),
        }

    def run_chunk(self, state, n: int):
        state, metrics = self.trainer.run_iterations(state, n)
        return state, {k: float(v) for k, v in fetch(metrics).items()}

    def chunk_metrics(self, metrics: dict, n: int, dt: float, first_chunk: bool, step: int) -> None:
        metrics["time/steps_per_sec"] = n / dt


def build(cfg: Config) -> VLASFTTrainer:
    from rlinf_jax.flow.embodied_runner import build_trainer

    if cfg.cluster.component_placement not in ("collocated",) or cfg.flow.runner == "staged":
        raise BadInput("runner.task=sft with actor.model.kind=vla runs collocated; drop the placement/flow settings")
    cfg.sft.warm_start_steps = 0  # the core must not clone on its own: this run does
    core = build_trainer(cfg)
    return VLASFTTrainer(cfg, core)


def run(cfg: Config, console=None):
    from rlinf_jax.flow.reasoning_runner import LMRunSummary

    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    trainer = build(cfg)
    run_dir, resume_path = open_run_dir(cfg)
    result = VLASFTLoop(cfg, trainer, run_dir, resume_path, console).run()
    first = result.first or {}
    ran = result.step - result.start_step
    return LMRunSummary(
        task="sft",
        run_dir=result.run_dir,
        steps=result.step,
        initial_accuracy=first.get("eval/success"),
        eval_accuracy=None if result.last_eval is None else result.last_eval.get("eval/success"),
        samples_per_sec=ran * trainer.batch_size / result.train_sec if result.train_sec else 0.0,
        wall_sec=time.perf_counter() - t_start,
        resumed_from=result.resumed_from,
        warm_start=None,
        metric="success",
    )


def load_params(cfg: Config, core: PPOTrainer, params):
    """The parameters of the SFT run or checkpoint ``actor.model.path`` names, for a model
    shaped like ``params``. The checkpoint is read onto a state built from that run's own
    config.yaml (its env batch may differ from this run's); a model of other sizes, or a
    path that is no VLA SFT run, is bad input."""
    from pathlib import Path

    from rlinf_jax.config import load_config_file
    from rlinf_jax.flow.embodied_runner import build_trainer
    from rlinf_jax.runtime import find_checkpoint, restore_checkpoint

    given = cfg.actor.model.path
    point = find_checkpoint(given, "actor.model.path")
    config_path = Path(point.directory).parent / "config.yaml"
    if not config_path.is_file():
        raise BadInput(f"actor.model.path={given!r}: {config_path} is missing; point it at a sft_vla_tabletop run folder")
    saved_cfg = load_config_file(config_path, [])
    if saved_cfg.actor.model.kind != cfg.actor.model.kind or saved_cfg.runner.task != "sft":
        raise BadInput(
            f"actor.model.path={given!r} is a runner.task={saved_cfg.runner.task} run of actor.model.kind="
            f"{saved_cfg.actor.model.kind}; a {cfg.actor.model.kind} RL run starts from a runner.task=sft run of that kind"
        )
    saved_cfg.actor.model.path = ""
    saved_cfg.sft.warm_start_steps = 0
    saved = build_trainer(saved_cfg)
    template = saved.fresh_state(saved._init_params)
    template = template.replace(opt_state=bc_optimizer(saved_cfg).init(template.params))
    restored, _ = restore_checkpoint(point, jax.device_get(template), keep=saved_cfg.runner.keep_checkpoints)
    shapes = lambda tree: jax.tree.map(lambda x: tuple(np.shape(x)), tree)  # noqa: E731
    if shapes(restored.params) != shapes(params):
        raise BadInput(
            f"actor.model.path={given!r} holds a model of other sizes than actor.model.* describes; "
            "use the SFT run's actor.model settings"
        )
    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), restored.params)

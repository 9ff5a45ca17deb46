"""Supervised fine-tuning of a VLA policy on the tabletop's expert demonstrations, as a run of
its own (``runner.task=sft`` with ``actor.model.kind=vla``; recipe ``sft_vla_tabletop``).

The run has the shape of an embodied run: the same model, run directory, checkpoints,
per-split evaluation (``eval/success/<split>``) and host loop; an iteration is one
behaviour-cloning step (`cloning.bc_step` on a minibatch of demonstration steps) instead of
a PPO iteration. Its checkpoints hold the embodied `TrainState` with the cloning
optimiser's state, so an RL run starts from it with ``actor.model.path=<this run>`` and
reads only the parameters (`rlinf_jax.tasks.embodied.warm_start.load_sft_params`).

With ``sft.dagger_rounds`` > 0 the run aggregates DAgger data (`visits.dagger_data`) at
evenly spaced steps (``k * max_steps / (rounds + 1)``): the current policy plays
``sft.dagger_episodes`` training episodes, the expert labels the states it visited, and
cloning continues on the demos plus every round so far. A resumed run re-collects the
rounds before its step with the restored policy (the data is not checkpointed).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput
from rlinf_jax.flow.fused import Fused
from rlinf_jax.flow.host_loop import HostLoop, NothingToDo, enable_compilation_cache, open_run_dir
from rlinf_jax.flow.trainer import Trainer
from rlinf_jax.envs.tabletop import visits
from rlinf_jax.sharding.mesh import fetch
from rlinf_jax.tasks.embodied import cloning
from rlinf_jax.tasks.embodied.layouts import placed_trainer
from rlinf_jax.tasks.embodied.setup import make_setup
from rlinf_jax.tasks.embodied.state import TrainState
from rlinf_jax.tasks.sft.loop import LMRunSummary


def cloning_steps(graphdef, tx, batch_size: int, ts: TrainState, n, data, rows):
    """``n`` guarded cloning steps on ``data``: the state and the steps' mean metrics."""

    def step(i, carry):
        ts, loss_sum, acc_sum, skipped = carry
        key = jax.random.fold_in(ts.key, ts.step)  # a resumed run draws what it would have
        params, opt_state, loss, acc, ok = cloning.bc_step(
            graphdef, tx, data, batch_size, ts.params, ts.opt_state, key, rows=rows
        )
        ts = ts.replace(
            params=params, opt_state=opt_state, step=ts.step + 1, bad_iterations=jnp.where(ok, 0, ts.bad_iterations + 1)
        )
        return ts, loss_sum + jnp.where(ok, loss, 0.0), acc_sum + jnp.where(ok, acc, 0.0), skipped + (~ok)

    zero = jnp.zeros((), jnp.float32)
    ts, loss, acc, skipped = jax.lax.fori_loop(0, n, step, (ts, zero, zero, zero))
    taken = jnp.maximum(n - skipped, 1.0)
    return ts, {"train/bc_loss": loss / taken, "train/bin_accuracy": acc / taken, "train/skipped_updates": skipped}


class VLASFTTrainer(Trainer):
    """Behaviour cloning on the demonstrations, with PPO's fused runner for the model, state
    layout and evaluation (what a PPO run warm-started from this checkpoint reads back)."""

    def __init__(self, cfg: Config, core: Fused):
        self.cfg, self.core, self.env = cfg, core, core.algorithm.env
        self.policy, self.graphdef = core.algorithm.policy, core.algorithm.graphdef
        self.placement = core.placement
        self.tx = cloning.sft_optimizer(cfg)
        self.data = None

    # --------------------------------------------------------------- state
    def init(self) -> TrainState:
        ts = self.core.init()
        return ts.replace(opt_state=self.tx.init(ts.params))

    def start(self, ts: TrainState) -> TrainState:
        return self.core.place(ts)

    def progress(self, ts: TrainState) -> tuple[int, int]:
        return int(ts.step), int(ts.bad_iterations)

    # ------------------------------------------------------------ training
    def compile(self, ts: TrainState, eval_key) -> None:
        """Collects the demonstrations (timed as the run's ``time/demo_sec``)."""
        sft, seed = self.cfg.sft, self.cfg.runner.seed
        data = visits.expert_demos(self.env, sft.num_demos, seed)
        self.num_examples = len(data["action"])
        self.batch_size = min(sft.batch_size, self.num_examples)
        self.dagger_steps_at = self._dagger_schedule()
        if not self.dagger_steps_at:
            self.data = cloning.bc_arrays(self.policy, data)
            self.rows = None  # every step draws distinct demo steps, as without DAgger
        else:
            self.capacity = visits.dagger_capacity(
                self.env, self.num_examples, len(self.dagger_steps_at), sft.dagger_episodes
            )
            self.demos = {k: data[k] for k in visits.STEP_KEYS}
            self.data = cloning.pad_steps(self.policy, self.demos, self.capacity)
            self.rows = jnp.int32(self.num_examples)
            self._visit = visits.policy_visitor(self.env, self.policy, self.graphdef, greedy=True)
        self.rounds_done = 0
        steps = functools.partial(cloning_steps, self.graphdef, self.tx, self.batch_size)
        self._steps = jax.jit(steps, donate_argnums=0)

    def _dagger_schedule(self) -> list[int]:
        """The steps at which DAgger rounds collect data (empty without DAgger)."""
        sft, total = self.cfg.sft, self.cfg.runner.max_steps
        return [total * k // (sft.dagger_rounds + 1) for k in range(1, sft.dagger_rounds + 1)]

    def _dagger_round(self, ts: TrainState) -> None:
        """Adds one round of the current policy's visited states, labelled by the expert."""
        r = self.rounds_done = self.rounds_done + 1
        new, success = visits.dagger_data(
            self.env, self._visit, ts.params, self.cfg.sft.dagger_episodes, self.cfg.runner.seed * 1000 + r
        )
        self.demos = {k: np.concatenate([self.demos[k], new[k]]) for k in self.demos}
        self.data = cloning.pad_steps(self.policy, self.demos, self.capacity)
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
            part = {key: float(v) for key, v in fetch(part).items()}
            part = {key: v if key == "train/skipped_updates" else v * k for key, v in part.items()}  # sums
            metrics = part if metrics is None else {key: metrics[key] + part[key] for key in part}
            done, step = done + k, step + k
        out = {key: v if key == "train/skipped_updates" else v / n for key, v in metrics.items()}
        return ts, {**out, **self.dagger_metrics}

    def run_eval(self, ts: TrainState, key) -> dict:
        return self.core.evaluate(ts.params, ts.obs_stats, key)


class VLASFTLoop(HostLoop):
    label = "sft"
    shown = {"train/bc_loss": "loss", "eval/success": "success"}
    eval_metric = "eval/success"
    unit = "steps"
    diverged_hint = "Lower sft.lr"

    def first_record(self, state) -> dict:
        return {
            "time/demo_sec": self.compile_sec,
            "sft/demo_steps": self.trainer.num_examples,
            **self.evaluate(state, 0),
        }

    def run_chunk(self, state, n: int):
        return self.trainer.run_iterations(state, n)

    def chunk_metrics(self, metrics: dict, n: int, dt: float, first_chunk: bool, step: int) -> None:
        metrics["time/steps_per_sec"] = n / dt


def build(cfg: Config) -> VLASFTTrainer:
    if cfg.cluster.component_placement not in ("collocated",) or cfg.flow.runner == "staged":
        raise BadInput("runner.task=sft with actor.model.kind=vla runs collocated; drop the placement/flow settings")
    return VLASFTTrainer(cfg, placed_trainer(cfg, make_setup(cfg)))


def run(cfg: Config, console=None) -> LMRunSummary | NothingToDo:
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    with open_run_dir(cfg) as opened:
        if opened.done is not None:
            return opened.done
        run_dir, resume_path = opened.run_dir, opened.resume_path
        trainer = build(cfg)
        result = VLASFTLoop(cfg, trainer, run_dir, resume_path, console).run()
        return LMRunSummary.of(
            result, "sft", trainer.batch_size, time.perf_counter() - t_start, metric="success"
        )

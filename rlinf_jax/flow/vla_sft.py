"""Supervised fine-tuning of a VLA policy on the tabletop's expert demonstrations, as a run of
its own (``runner.task=sft`` with ``actor.model.kind=vla``; recipe ``sft_vla_tabletop``).

The run has the shape of an embodied run: the same model, run directory, checkpoints,
per-split evaluation (``eval/success/<split>``) and host loop; an iteration is one
behaviour-cloning step (`vla_bc.bc_loss` on a minibatch of demonstration steps) instead of a
PPO iteration. Its checkpoints hold the embodied `TrainState` with the cloning optimiser's
state, so an RL run starts from it with ``actor.model.path=<this run>`` and reads only the
parameters (`load_params`).
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
        self.data = vla_bc.bc_arrays(self.policy, data)
        self.num_examples = len(data["action"])
        self.batch_size = min(sft.batch_size, self.num_examples)

        def steps(ts: TrainState, n):
            def step(i, carry):
                ts, loss_sum, acc_sum = carry
                key = jax.random.fold_in(ts.key, ts.step)  # a resumed run draws what it would have
                params, opt_state, loss, acc = vla_bc.bc_step(
                    self.policy, self.graphdef, self.tx, self.data, self.batch_size, ts.params, ts.opt_state, key
                )
                ts = ts.replace(params=params, opt_state=opt_state, step=ts.step + 1)
                return ts, loss_sum + loss, acc_sum + acc

            zero = jnp.zeros((), jnp.float32)
            ts, loss, acc = jax.lax.fori_loop(0, n, step, (ts, zero, zero))
            return ts, {"train/bc_loss": loss / n, "train/bin_accuracy": acc / n}

        self._steps = jax.jit(steps, donate_argnums=0)

    def run_iterations(self, ts: TrainState, n: int):
        return self._steps(ts, jnp.int32(n))

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

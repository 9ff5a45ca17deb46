"""An sft run: supervised fine-tuning of a language model, or behaviour cloning of a VLA
(``actor.model.kind=vla``) on the tabletop's expert demonstrations."""

from __future__ import annotations

import time

from rlinf_jax.config.schema import Config
from rlinf_jax.flow.host_loop import enable_compilation_cache, open_run_dir
from rlinf_jax.tasks.sft import vla
from rlinf_jax.tasks.sft.lm import SFTTrainer
from rlinf_jax.tasks.sft.loop import LMLoop, LMRunSummary


def run_lm(cfg: Config, console=None) -> LMRunSummary:
    """Trains (or resumes) the language-model SFT run ``cfg`` describes."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    run_dir, resume_path = open_run_dir(cfg)
    trainer = SFTTrainer(cfg)
    result = LMLoop(cfg, trainer, run_dir, resume_path, console).run()
    return LMRunSummary.of(result, "sft", trainer.samples_per_iteration, time.perf_counter() - t_start)


# What an sft run trains, by actor.model.kind: a VLA clones the expert, any other kind
# names no embodied model and the run fine-tunes the language model of actor.model.lm_*.
BY_MODEL_KIND = {"vla": vla.run}


def run(cfg: Config, console=None) -> LMRunSummary:
    return BY_MODEL_KIND.get(cfg.actor.model.kind, run_lm)(cfg, console)

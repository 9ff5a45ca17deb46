"""An sft run of a language model: supervised fine-tuning on the run's data. (A VLA's sft
run, behaviour cloning on the tabletop's expert, is `tasks.sft.vla`; the task registry
picks between them by ``actor.model.kind``.)"""

from __future__ import annotations

import time

from rlinf_jax.config.schema import Config
from rlinf_jax.flow.host_loop import NothingToDo, enable_compilation_cache, open_run_dir
from rlinf_jax.flow.plan import check_before_first_step
from rlinf_jax.tasks.sft.lm import SFTTrainer
from rlinf_jax.tasks.sft.lm_model import check_resume_layout
from rlinf_jax.tasks.sft.plan import programs as plan_programs
from rlinf_jax.tasks.sft.loop import LMLoop, LMRunSummary


def run_lm(cfg: Config, console=None) -> LMRunSummary | NothingToDo:
    """Trains (or resumes) the language-model SFT run ``cfg`` describes."""
    t_start = time.perf_counter()
    enable_compilation_cache(cfg.runner.compilation_cache)
    with open_run_dir(cfg) as opened:
        if opened.done is not None:
            return opened.done
        run_dir, resume_path = opened.run_dir, opened.resume_path
        check_resume_layout(cfg, resume_path)
        check_before_first_step(cfg, lambda devices: plan_programs(cfg, devices, twins=False), console)
        trainer = SFTTrainer(cfg)
        result = LMLoop(cfg, trainer, run_dir, resume_path, console).run()
        return LMRunSummary.of(result, "sft", trainer.samples_per_iteration, time.perf_counter() - t_start)

"""``python -m rlinf_jax.evaluate --checkpoint DIR --data PATH``: pass@1 and pass@k of a
language model on a prompt file (or its run's held-out split).

Settings (tokenizer, template, generation length, reward) come from the run's resolved
``config.yaml``; for a bare Hugging Face / converted directory from the ``grpo_math`` recipe
with the directory's own tokenizer. ``key=value`` overrides apply on top of either (e.g.
``rollout.max_new_tokens=1024 data.use_chat_template=true``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from rlinf_jax.agents.factory import env_factory, tool_executor
from rlinf_jax.config import load_config, load_config_file
from rlinf_jax.data import build_datasets, load_prompt_dataset, run_tokenizer
from rlinf_jax.errors import BadInput
from rlinf_jax.rewards import RewardFunction
from rlinf_jax.rollout.lm_io import PromptEncoder, pad_id, stop_tokens
from rlinf_jax.rollout.multi_turn import MultiTurnRollout
from rlinf_jax.rollout.sampler import Sampler, SamplingParams
from rlinf_jax.rollout.scoring import score_dataset
from rlinf_jax.runtime import find_checkpoint
from rlinf_jax.tasks.reasoning.agent_collect import AgentCollector
from rlinf_jax.tasks.sft.lm_model import load_checkpoint_policy, load_policy


def lm_settings(checkpoint: Path, overrides):
    """``(cfg, load_model, step, source)`` for a run checkpoint or a model directory: the
    settings to sample it with, a function that loads the model, the checkpoint's step (None
    for a model directory) and the step folder or model directory the model comes from."""
    if checkpoint.is_dir() and (checkpoint / "config.json").is_file():
        cfg = load_config("grpo_math", [f"data.tokenizer={checkpoint}", f"actor.model.path={checkpoint}",
                                        "data.template=math", *overrides])
        return cfg, lambda: load_policy(cfg).model, None, checkpoint
    point = find_checkpoint(checkpoint, "--checkpoint")
    config_path = Path(point.directory).parent / "config.yaml"
    if not config_path.is_file():
        raise BadInput(f"{config_path} is missing: evaluate needs the run folder's resolved config next to checkpoints/")
    cfg = load_config_file(config_path, overrides)
    if cfg.runner.task not in ("sft", "reasoning"):
        raise BadInput(
            f"{point.path} is a checkpoint of an {cfg.runner.task} run; --checkpoint is for language models "
            "(evaluate an embodied run with: python -m rlinf_jax.evaluate RUN_FOLDER)"
        )
    return cfg, lambda: load_checkpoint_policy(point.path)[0], point.step, Path(point.path)


def evaluate_lm(checkpoint, data=None, overrides=(), seed: int = 0, ks=None, n=None, temperature=None,
                out=None, progress: bool = True) -> dict:
    ks = sorted(set(ks or ([1] if n is None else [1, n])))
    n = max(ks) if n is None else int(n)
    if min(ks) < 1 or n < max(ks):
        raise BadInput(f"pass@k needs 1 <= k <= --n; got --k {' '.join(map(str, ks))} with --n {n}")
    temperature = (0.0 if n == 1 else 1.0) if temperature is None else float(temperature)
    if n > 1 and temperature == 0:
        raise BadInput(f"--n {n} greedy samples would all be the same answer; give --temperature > 0 or --n 1")

    checkpoint = Path(checkpoint)
    if not checkpoint.exists():
        raise BadInput(f"--checkpoint {checkpoint}: no such path; give a run folder, a checkpoint or a model directory")
    cfg, load_model, step, source = lm_settings(checkpoint, overrides)
    # The data is read before the model, so a bad file fails fast.
    if data is not None:
        dataset = load_prompt_dataset(data, cfg.data.prompt_key, cfg.data.answer_key)
        data_label = Path(data).stem
    else:
        dataset = build_datasets(cfg.data)[1]
        if dataset is None:
            raise BadInput("the run has no held-out data (data.eval_path is unset); pass --data PATH")
        data_label = "heldout"

    model = load_model()
    tokenizer = run_tokenizer(cfg.data.tokenizer, model.config.vocab_size)
    encoder = PromptEncoder(cfg.data, tokenizer)
    ro = cfg.rollout
    sampling = SamplingParams(ro.max_new_tokens, temperature, ro.top_p, ro.top_k, stop_tokens(tokenizer))
    sampler = Sampler(model, pad_id=pad_id(tokenizer))
    if out is None:
        if step is None:  # a model directory is not ours to write into
            out = Path.cwd() / f"eval_{source.name}_{data_label}.json"
        else:
            out = _run_folder(checkpoint) / "eval" / f"{data_label}_step{step}.json"
    out = Path(out)

    if cfg.agent.enabled:
        # An agentic run is scored on whole episodes, with its tools (accuracy and per-turn statistics).
        if n != 1:
            raise BadInput("an agentic run is evaluated on one episode per problem; leave out --n / --k")
        result, records = _agentic_scores(cfg, sampler, encoder, tokenizer, dataset, seed, temperature), []
    else:
        result, records = _scores(cfg, sampler, encoder, dataset, sampling, seed, n, ks, progress)
    summary = {
        "checkpoint": str(checkpoint),
        "step": step,
        "data": str(data) if data is not None else "heldout",
        "problems": len(dataset),
        "samples_per_problem": n,
        "temperature": temperature,
        "seed": seed,
        **{k: result[k] for k in result},
        "report": str(out),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**summary, "records": records}, indent=1) + "\n")
    return summary


def _scores(cfg, sampler, encoder, dataset, sampling, seed, n, ks, progress):
    with RewardFunction(cfg.reward) as reward_fn, _progress(len(dataset) * n, progress) as advance:
        result = score_dataset(
            sampler, encoder, reward_fn, dataset, sampling, jax.random.PRNGKey(seed),
            max(cfg.rollout.eval_batch_size, n), n_samples=n, ks=tuple(ks),
            progress=(lambda done: advance(done * n)), keep_responses=True,
        )
    return result, result.pop("records")


def _agentic_scores(cfg, sampler, encoder, tokenizer, dataset, seed, temperature) -> dict:
    ag, ro = cfg.agent, cfg.rollout
    limits = ag.limits()
    executor = tool_executor(ag)
    try:
        collector = AgentCollector(MultiTurnRollout(sampler, tokenizer, limits), encoder, env_factory(ag, executor),
                                   cfg.reward, None, 0, 1, temperature)
        scores = collector.evaluate(dataset, jax.random.PRNGKey(seed), ro.eval_batch_size, temperature)
    finally:
        if executor is not None:
            executor.close()
    return {k.removeprefix("eval/"): v for k, v in scores.items()}


def _run_folder(checkpoint: Path) -> Path:
    return Path(find_checkpoint(checkpoint, "--checkpoint").directory).parent


class _progress:
    """A rich progress bar over answers on stderr; a no-op when off."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled, self.bar = total, enabled, None

    def __enter__(self):
        if not self.enabled:
            return lambda k: None
        self.bar = Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TimeRemainingColumn(), console=Console(file=sys.stderr))
        self.bar.__enter__()
        task = self.bar.add_task("eval", total=self.total)
        return lambda k: self.bar.advance(task, k)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

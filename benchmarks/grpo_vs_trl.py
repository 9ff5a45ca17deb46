#!/usr/bin/env python
"""GRPO step time: our reasoning flow vs. TRL's ``GRPOTrainer`` (torch, no vLLM).

Both sides start from the same checkpoint (a Hugging Face directory holding the tiny
~2.9M-parameter Qwen2 of ``grpo_math``, with a character-level ``tokenizer.json`` that
encodes exactly like our ``CharTokenizer``) and train on the same prompts (procedural
single-digit sums) with the same settings:

    prompts x generations x new tokens   8 x 4 x 32 per step (--prompts-per-step --generations --new-tokens)
    sampling                             temperature 1, no top-k / top-p, stop at the end token
    advantages                           GRPO: (r - group mean) / group std
    loss                                 PPO-clip 0.2 / 0.2, token mean over the batch (TRL's "dapo")
    KL                                   none (beta 0)
    optimiser                            AdamW, lr 5e-5 constant, grad clip 1.0, no weight decay
    update                               one optimiser step per generation batch (on-policy)

By default the checkpoint is the randomly initialised model, whose responses run to all 32
new tokens (an end token is rare), so every step generates and trains on the stated token
count. ``--warm-start-steps N`` first runs N SFT steps of ours and exports that model: its
answers stop after ~11 tokens and the reward curve means something, but both sides then
generate far fewer tokens (generation is where we gain most, so the ratio is lower).

Each side runs in its own process pinned to one CPU (``sched_setaffinity``) with one
thread (``torch.set_num_threads(1)``; ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1``). Seconds per step are the median over the steps after
``--warmup`` (compilation and first-call costs excluded); each side's reward curve (mean
reward of each step's samples) is reported.

The last line of stdout is one JSON object with the figures and ``ratio`` = TRL's seconds
per step over ours (higher is better for us).

    pip install 'rlinf-jax[bench]'          # TRL
    python benchmarks/grpo_vs_trl.py [--steps 12] [--warmup 2] [--warm-start-steps 0]

Tunix, the JAX peer, is compared on the same inputs by ``grpo_vs_tunix.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from grpo_common import add_arguments, check_arguments, make_checkpoint, make_prompts, pin_one_cpu, run_ours, run_rounds, summarise
from recorded import warn_regressions


# ----------------------------------------------------------------------------- TRL's side


def run_trl(args) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    from datasets import load_dataset
    from transformers import (
        AutoModelForCausalLM,
        PreTrainedTokenizerFast,
        TrainerCallback,
    )
    from trl import GRPOConfig, GRPOTrainer

    from rlinf_jax.rewards import RewardConfig, RewardFunction

    reward_fn = RewardFunction(RewardConfig(num_workers=0))

    def reward(prompts, completions, answer, **_):
        return [float(r) for r in reward_fn(completions, answer).rewards]

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tok = PreTrainedTokenizerFast.from_pretrained(args.model)
    tok.padding_side = "left"
    data = load_dataset("json", data_files=str(args.prompts), split="train")
    steps = args.steps
    config = GRPOConfig(
        output_dir=str(Path(args.work) / "trl"),
        per_device_train_batch_size=args.prompts_per_step * args.generations,
        num_generations=args.generations,
        max_completion_length=args.new_tokens,
        temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=args.lr, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", epsilon=0.2, epsilon_high=0.2, beta=0.0, loss_type="dapo",
        scale_rewards="group", num_iterations=1, max_steps=steps, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, bf16=False, seed=0, dataloader_num_workers=0, disable_dropout=True,
    )

    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                          processing_class=tok, callbacks=[Timer()])
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    import transformers
    import trl

    versions = f"trl {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}"
    return {"step_sec": times, "reward": rewards, "response_length": lengths, "versions": versions}


def child(args) -> None:
    cpu = pin_one_cpu()
    out = run_trl(args) if args.side == "trl" else run_ours(args)
    out["cpu"] = cpu
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--side", choices=("trl", "ours"), help=argparse.SUPPRESS)
    args = p.parse_args()
    check_arguments(p, args)
    if args.side:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"warm start: {args.warm_start_steps} SFT steps ...", flush=True)
        model = make_checkpoint(work, args.warm_start_steps, args.size)
        prompts = make_prompts(work, 512)
        results = run_rounds({"ours": sys.executable, "trl": sys.executable}, args, model, prompts, work, __file__)
    versions = results["trl"][0].get("versions", "")
    summary = summarise(results, args, "trl")
    # TRL as its users run it on a CPU: GRPOTrainer's defaults for generation (transformers'
    # generate, its dynamic cache, eager) and training (no torch.compile), float32.
    summary["peer"] = f"{versions}: GRPOTrainer, generate with its defaults (dynamic cache, eager), no torch.compile, float32"
    warn_regressions("grpo_vs_trl", summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

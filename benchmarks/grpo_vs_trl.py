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

Tunix (google-tunix, JAX) conflicts with the current transformers and safetensors; it is
not compared here (install it in a separate virtual environment to do so).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recorded import warn_regressions  # noqa: E402

SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


# ----------------------------------------------------------------------------- shared inputs


def char_tokenizer_json(out_dir: Path) -> None:
    """A ``tokenizer.json`` whose ids are our CharTokenizer's: one token per character,
    specials 0-3 (pad, bos, eos, unk), nothing added automatically."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlinf_jax.data import CharTokenizer

    vocab = CharTokenizer().get_vocab()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.add_special_tokens({"additional_special_tokens": []})
    fast.save_pretrained(str(out_dir))


def make_checkpoint(work: Path, warm_start_steps: int) -> Path:
    """SFT warm start of the tiny model with our trainer, exported as a HF directory."""
    from rlinf_jax.config import load_config
    from rlinf_jax.policies.lm import save_pretrained
    from rlinf_jax.tasks.sft.lm_model import load_checkpoint_policy
    from rlinf_jax.tasks.sft.run import run

    model_dir = work / "model"
    cfg = load_config("sft_math", [f"runner.output_dir={work}", "runner.experiment_name=sft",
                                   f"runner.max_steps={max(warm_start_steps, 1)}", "runner.eval_interval=0",
                                   "runner.save_interval=0", "runner.progress_bar=false", "runner.tensorboard=false",
                                   "runner.compilation_cache=''"])
    if warm_start_steps > 0:
        run(cfg)
        model, _ = load_checkpoint_policy(work / "sft")
    else:
        from flax import nnx

        from rlinf_jax.policies.lm import CausalLM
        from rlinf_jax.tasks.sft.lm_model import lm_config_from

        model = CausalLM(lm_config_from(cfg.actor.model), rngs=nnx.Rngs(0))
    save_pretrained(model, model_dir)
    char_tokenizer_json(model_dir)
    return model_dir


def make_prompts(work: Path, n: int) -> Path:
    """Procedural single-digit sums; the prompt text starts with the bos token as our
    tokenizer's encode would add it, so both sides see the same ids."""
    from rlinf_jax.data import ProceduralMathDataset

    ds = ProceduralMathDataset(n, (1,), "train", seed=0)
    path = work / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": "<bos>" + r["prompt"], "answer": r["answer"]}) + "\n" for r in ds))
    return path


# ----------------------------------------------------------------------------- the two sides


def pin_one_cpu() -> int:
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


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
    return {"step_sec": times, "reward": rewards}


def run_ours(args) -> dict:
    from rlinf_jax.config import load_config
    from rlinf_jax.tasks.reasoning.trainer import ReasoningTrainer

    cfg = load_config("grpo_math", [
        f"runner.output_dir={Path(args.work) / 'ours'}", "runner.compilation_cache=''",
        "sft.warm_start_steps=0", f"actor.model.path={args.model}", f"data.tokenizer={args.model}",
        "data.source=files", f"data.train_path={args.prompts}", "data.template=plain",
        f"data.rollout_batch_size={args.prompts_per_step}", f"algorithm.group_size={args.generations}",
        f"rollout.max_new_tokens={args.new_tokens}", "rollout.temperature=1.0",
        f"actor.global_batch_size={args.prompts_per_step * args.generations}",
        f"actor.micro_batch_size={args.prompts_per_step * args.generations}",
        f"actor.optim.lr={args.lr}", "algorithm.clip_low=0.2", "algorithm.clip_high=0.2", "algorithm.kl_coef=0.0",
        "algorithm.loss_agg=token-mean", "algorithm.update_epochs=1", "reward.num_workers=0",
        "cluster.num_devices=1",
    ])
    trainer = ReasoningTrainer(cfg)
    ts = trainer.init()
    times, rewards = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        ts, metrics = trainer.iteration(ts, step)
        times.append(time.perf_counter() - t0)
        rewards.append(metrics["rollout/reward_mean"])
    trainer.close()
    return {"step_sec": times, "reward": rewards}


def child(args) -> None:
    cpu = pin_one_cpu()
    out = run_trl(args) if args.side == "trl" else run_ours(args)
    out["cpu"] = cpu
    print(json.dumps(out))


def spawn(side: str, args, model: Path, prompts: Path, work: Path) -> dict:
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA).strip(),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, __file__, "--side", side, "--model", str(model), "--prompts", str(prompts),
           "--work", str(work), "--steps", str(args.steps), "--prompts-per-step", str(args.prompts_per_step),
           "--generations", str(args.generations), "--new-tokens", str(args.new_tokens), "--lr", str(args.lr)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"{side} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the timing")
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warm-start-steps", type=int, default=0,
                   help="SFT steps before the comparison (0: the random model, which uses all --new-tokens)")
    p.add_argument("--side", choices=("trl", "ours"), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"warm start: {args.warm_start_steps} SFT steps ...", flush=True)
        model = make_checkpoint(work, args.warm_start_steps)
        prompts = make_prompts(work, 512)
        results = {}
        for side in ("ours", "trl"):
            print(f"running {side} ...", flush=True)
            results[side] = spawn(side, args, model, prompts, work)
    summary = {}
    for side, r in results.items():
        timed = r["step_sec"][args.warmup :]
        summary[side] = {
            "sec_per_step": statistics.median(timed),
            "sec_per_step_mean": statistics.mean(timed),
            "first_step_sec": r["step_sec"][0],
            "reward": [round(x, 4) for x in r["reward"]],
        }
        print(f"{side:5s} {summary[side]['sec_per_step']:.3f} s/step (median of {len(timed)}), "
              f"reward {summary[side]['reward'][0]:.3f} -> {summary[side]['reward'][-1]:.3f}")
    summary["settings"] = {
        "prompts": args.prompts_per_step, "generations": args.generations, "new_tokens": args.new_tokens,
        "lr": args.lr, "steps": args.steps, "warmup": args.warmup, "warm_start_steps": args.warm_start_steps,
        "threads": 1,
    }
    summary["ratio"] = summary["trl"]["sec_per_step"] / summary["ours"]["sec_per_step"]
    warn_regressions("grpo_vs_trl", summary)
    print(json.dumps(summary))


if __name__ == "__main__":
    if "--side" in sys.argv:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA).strip()
    main()

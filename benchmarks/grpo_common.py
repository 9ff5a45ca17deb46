"""What the GRPO step benchmarks share: the checkpoint and prompts both sides start from,
our side of the comparison, the one-core pinning and the summary.

``grpo_vs_trl.py`` and ``grpo_vs_tunix.py`` import this from the benchmarks folder; the
peer sides run in their own processes (Tunix in its own virtual environment), so nothing
here may import JAX or rlinf_jax's trainers at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def single_thread_env() -> dict:
    """Environment of a child side: one XLA thread, one BLAS thread, quiet tokenizers."""
    return {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA).strip(),
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# ----------------------------------------------------------------------------- shared inputs


def char_tokenizer_json(out_dir: Path, vocab_size: int = 0) -> None:
    """A ``tokenizer.json`` whose ids are our CharTokenizer's: one token per character,
    specials 0-3 (pad, bos, eos, unk), nothing added automatically. ``vocab_size`` larger
    than the characters' pads the vocabulary with tokens ``<t{id}>`` that no text encodes
    to but that decode, so a model of a real vocabulary's size (0.5B: 151,936) can sample
    any of its ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlinf_jax.data import CharTokenizer

    vocab = CharTokenizer().get_vocab()
    vocab.update({f"<t{i}>": i for i in range(len(vocab), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.add_special_tokens({"additional_special_tokens": []})
    fast.save_pretrained(str(out_dir))


def make_checkpoint(work: Path, warm_start_steps: int, size: str = "tiny") -> Path:
    """The model both sides start from, as a HF directory (safetensors + config +
    tokenizer). ``tiny``: ``grpo_math``'s model, randomly initialised or after
    ``warm_start_steps`` SFT steps of our trainer; ``0.5b``: a random Qwen2 of
    Qwen2.5-0.5B's shapes (``lm_sizes``) over the character tokenizer padded to its
    vocabulary."""
    if size != "tiny":
        return _sized_checkpoint(work, size)
    from rlinf_jax.config import load_config
    from rlinf_jax.policies.lm import save_pretrained
    from rlinf_jax.tasks.sft.lm_model import load_checkpoint_policy
    from rlinf_jax.tasks.sft.run import run_lm

    model_dir = work / "model"
    cfg = load_config("sft_math", [f"runner.output_dir={work}", "runner.experiment_name=sft",
                                   f"runner.max_steps={max(warm_start_steps, 1)}", "runner.eval_interval=0",
                                   "runner.save_interval=0", "runner.progress_bar=false", "runner.tensorboard=false",
                                   "runner.compilation_cache=''"])
    if warm_start_steps > 0:
        run_lm(cfg)
        model, _ = load_checkpoint_policy(work / "sft")
    else:
        from flax import nnx

        from rlinf_jax.policies.lm import CausalLM
        from rlinf_jax.tasks.sft.lm_model import lm_config_from

        model = CausalLM(lm_config_from(cfg.actor.model), rngs=nnx.Rngs(0))
    save_pretrained(model, model_dir)
    char_tokenizer_json(model_dir)
    return model_dir


def _sized_checkpoint(work: Path, size: str) -> Path:
    from lm_sizes import SCALES, SIZES

    from rlinf_jax.data import CharTokenizer
    from rlinf_jax.policies.lm.tiny import tiny_hf_model

    chars = CharTokenizer()
    hf = tiny_hf_model("qwen2", seed=0, scale=SCALES[size], attn_implementation="sdpa", **SIZES[size])
    # Sampling ends at the end token, as grpo_math's model does; the ids are the tokenizer's.
    for config in (hf.config, hf.generation_config):
        config.eos_token_id, config.bos_token_id, config.pad_token_id = chars.eos_id, chars.bos_id, chars.pad_id
    hf.generation_config.do_sample = True
    model_dir = work / "model"
    hf.save_pretrained(str(model_dir))
    char_tokenizer_json(model_dir, SIZES[size]["vocab_size"])
    return model_dir


def make_prompts(work: Path, n: int) -> Path:
    """Procedural single-digit sums; the prompt text starts with the bos token as our
    tokenizer's encode would add it, so both sides see the same ids."""
    from rlinf_jax.data import ProceduralMathDataset

    ds = ProceduralMathDataset(n, (1,), "train", seed=0)
    path = work / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": "<bos>" + r["prompt"], "answer": r["answer"]}) + "\n" for r in ds))
    return path


def pin_one_cpu() -> int:
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


# ----------------------------------------------------------------------------- our side


def run_ours(args) -> dict:
    """Our reasoning flow on the shared checkpoint and prompts, one iteration per step."""
    from rlinf_jax.config import load_config
    from rlinf_jax.tasks.reasoning.trainer import ReasoningTrainer

    cfg = load_config("grpo_math", [
        f"runner.output_dir={Path(args.work) / 'ours'}", "runner.compilation_cache=''",
        "sft.warm_start_steps=0", f"actor.model.path={args.model}", f"data.tokenizer={args.model}",
        "data.source=files", f"data.train_path={args.prompts}", "data.template=plain",
        f"data.rollout_batch_size={args.prompts_per_step}", f"algorithm.lm.group_size={args.generations}",
        f"rollout.max_new_tokens={args.new_tokens}", "rollout.temperature=1.0",
        f"actor.global_batch_size={args.prompts_per_step * args.generations}",
        f"actor.micro_batch_size={args.prompts_per_step * args.generations}",
        f"actor.optim.lr={args.lr}", "actor.optim.lr_schedule=constant", "algorithm.lm.clip_low=0.2",
        "algorithm.lm.clip_high=0.2", "algorithm.lm.kl_coef=0.0",
        "algorithm.lm.loss_agg=token-mean", "algorithm.update_epochs=1", "reward.num_workers=0",
        "cluster.num_devices=1", f"actor.model.matmul={args.matmul}",
    ])
    trainer = ReasoningTrainer(cfg)
    ts = trainer.init()
    times, rewards, lengths = [], [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        ts, metrics = trainer.iteration(ts, step)
        times.append(time.perf_counter() - t0)
        rewards.append(metrics["rollout/reward_mean"])
        lengths.append(metrics["rollout/response_length"])
    out = {"step_sec": times, "reward": rewards, "response_length": lengths}
    # FLOPs are counted on the jaxpr's dots, which MKL's custom call hides: counted with
    # XLA's products only (the same arithmetic: run --matmul xla for the figure).
    if args.matmul == "xla":
        import roofline

        parts = _step_flops(trainer, ts, args.steps)
        out.update({"flops_per_step": sum(p["flops"] for p in parts.values()), "flops_by_part": parts,
                    "peak_flops_per_s": roofline.peak_flops_per_s(args.peak_gflops)})  # this process's: one core
    trainer.close()
    return out


def _step_flops(trainer, ts, step: int) -> dict:
    """FLOPs of one more step, untimed, every jitted call of the sampler and the update
    counted; the decode loop times the steps it took (its rows stop at their end token)."""
    import roofline

    from rlinf_jax.rollout import sampler

    with roofline.counting_calls(sampler, {"prefill_prompts": 1, "decode_tokens": lambda s: int(s.step) - 1}) as gen, \
            roofline.counting_calls(trainer, {"_update": 1, "_ref_logprobs": 1}) as upd:
        trainer.iteration(ts, step)
    return {"sampling": gen, "update": upd}


# ----------------------------------------------------------------------------- the summary


def run_rounds(sides: dict, args, model: Path, prompts: Path, work: Path, script: str) -> dict:
    """Each side (name -> interpreter) once per round, the sides taking turns, so a slow
    spell of a shared machine falls on both; returns each side's runs in order."""
    results = {side: [] for side in sides}
    for round_ in range(args.rounds):
        for side, python in sides.items():
            print(f"round {round_ + 1}/{args.rounds}: {side} ...", flush=True)
            results[side].append(run_child(python, script, side, args, model, prompts, work))
    return results


def summarise(results: dict, args, peer: str) -> dict:
    """Median seconds per step over every run's steps after the warm-up, per side; the
    first run's reward curve; ``ratio`` = the peer's seconds per step over ours."""
    summary = {}
    for side, runs in results.items():
        timed = [t for r in runs for t in r["step_sec"][args.warmup :]]
        summary[side] = {
            "sec_per_step": statistics.median(timed),
            "sec_per_step_mean": statistics.mean(timed),
            "sec_per_step_by_round": [round(statistics.median(r["step_sec"][args.warmup :]), 4) for r in runs],
            "first_step_sec": runs[0]["step_sec"][0],
            "reward": [round(x, 4) for x in runs[0]["reward"]],
        }
        lengths = [x for r in runs for x in r.get("response_length", [])]
        if lengths:
            summary[side]["response_length_mean"] = round(statistics.mean(lengths), 2)
        print(f"{side:5s} {summary[side]['sec_per_step']:.3f} s/step (median of {len(timed)} over "
              f"{len(runs)} runs), reward {summary[side]['reward'][0]:.3f} -> {summary[side]['reward'][-1]:.3f}")
    summary["settings"] = {
        "prompts": args.prompts_per_step, "generations": args.generations, "new_tokens": args.new_tokens,
        "lr": args.lr, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
        "warm_start_steps": args.warm_start_steps, "threads": 1, "size": args.size, "matmul": args.matmul,
    }
    summary["ratio"] = summary[peer]["sec_per_step"] / summary["ours"]["sec_per_step"]
    # Our FLOP/s: one step's FLOPs (an extra step's: a step's response lengths, and so its
    # decode steps, vary) over the median seconds per step.
    import roofline

    ours = results["ours"][0]
    if not ours.get("flops_per_step"):
        print("FLOP/s not reported: MKL's custom call hides its products from the count (--matmul xla counts them)")
    else:
        peak = ours["peak_flops_per_s"]
        r = roofline.rate(ours["flops_per_step"], summary["ours"]["sec_per_step"], peak)
        print(roofline.line("ours FLOP/s", r, peak))
        summary.update(roofline.result_keys(r, peak))
        summary["ours"]["flops_by_part"] = ours["flops_by_part"]  # {part: {flops, calls}}
        # The peer samples and updates the same model on the same prompts: our count over its time.
        theirs = roofline.rate(ours["flops_per_step"], summary[peer]["sec_per_step"], peak)
        print(roofline.line(f"{peer} FLOP/s (same FLOP count)", theirs, peak))
        summary.update({k: v for k, v in roofline.result_keys(theirs, peak, peer).items() if k.startswith(peer)})
    return summary


# ----------------------------------------------------------------------------- the command line


def check_arguments(p, args) -> None:
    """Settings that cannot go together: one ``error:`` line from argparse (exit 2)."""
    if args.size != "tiny" and args.warm_start_steps:
        p.error("--warm-start-steps trains grpo_math's tiny model; leave it at 0 with --size " + args.size)


def add_arguments(p) -> None:
    """The settings both sides share, and the hidden ones a child side is started with."""
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2, help="first steps of each run left out of the timing")
    p.add_argument("--rounds", type=int, default=2, help="runs per side, the sides taking turns")
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warm-start-steps", type=int, default=0,
                   help="SFT steps before the comparison (0: the random model, which uses all --new-tokens)")
    p.add_argument("--size", choices=("tiny", "0.5b"), default="tiny",
                   help="tiny: grpo_math's ~2.9M-parameter model; 0.5b: Qwen2.5-0.5B's shapes, random weights")
    p.add_argument("--matmul", choices=("xla", "mkl"), default="xla",
                   help="our side's products: XLA's dot or Intel MKL (actor.model.matmul)")
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--peak-gflops", type=float,
                   help="the float32 matmul peak to measure FLOP/s against (default: measured by our side's process)")


def child_arguments(side: str, args, model: Path, prompts: Path, work: Path) -> list[str]:
    return ["--side", side, "--model", str(model), "--prompts", str(prompts), "--work", str(work),
            "--steps", str(args.steps), "--prompts-per-step", str(args.prompts_per_step),
            "--generations", str(args.generations), "--new-tokens", str(args.new_tokens), "--lr", str(args.lr),
            "--size", args.size, "--matmul", args.matmul,
            *(["--peak-gflops", str(args.peak_gflops)] if args.peak_gflops else [])]


def run_child(python: str, script: str, side: str, args, model: Path, prompts: Path, work: Path) -> dict:
    """One side in its own process (``python``: the interpreter of its environment); its last
    stdout line is its JSON result."""
    cmd = [python, script, *child_arguments(side, args, model, prompts, work)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=single_thread_env(), timeout=3600)
    if proc.returncode != 0:
        sys.exit(f"error: the {side} side failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])

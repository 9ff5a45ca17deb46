"""A Hugging Face or converted model directory in a run and in the API: it brings its own
tokenizer to the run (unless the command line names one), a tokenizer larger than its
vocabulary is one line, and `rj.restore` samples it as `evaluate --checkpoint` does."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

import rlinf_jax as rj
from rlinf_jax.data import CharTokenizer, PromptTemplate, load_tokenizer
from rlinf_jax.policies.lm import load_converted
from rlinf_jax.policies.lm.tiny import save_tiny
from rlinf_jax.tasks.sft.lm import SFTTrainer
from rlinf_jax.cli.train import main as train_main

torch.set_num_threads(1)

# One token per character, as the character tokenizer has, but in another order and with
# other special tokens: the same text gets other ids, so a run that fell back to `char`
# would show.
SPECIALS = ["<eos>", "<pad>", "<unk>"]
CHARS = [chr(c) for c in range(126, 31, -1)] + ["\n"]
VOCAB = len(SPECIALS) + len(CHARS)  # 99

# A run small enough to compile in seconds.
SMALL = ["data.train_size=64", "data.eval_size=8", "actor.global_batch_size=8", "actor.micro_batch_size=8",
         "rollout.max_new_tokens=12", "rollout.eval_batch_size=8", "runner.progress_bar=false",
         "runner.tensorboard=false"]


def save_char_tokenizer(path) -> Tokenizer:
    raw = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + CHARS)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # newline included
    raw.decoder = decoders.Fuse()
    transformers.PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", pad_token="<pad>",
                                         unk_token="<unk>").save_pretrained(str(path))
    return raw


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """``(hf, converted, too_small, raw)``: a tiny Qwen2 with the tokenizer above, its
    converted directory, and a model of 97 rows carrying the same 99-id tokenizer."""
    root = tmp_path_factory.mktemp("models")
    hf, _ = save_tiny("qwen2", root / "hf", vocab_size=VOCAB)
    raw = save_char_tokenizer(hf)
    converted = rj.convert(hf, root / "converted")["to"]
    too_small, _ = save_tiny("qwen2", root / "too_small")  # TINY_CONFIGS' vocabulary: 97
    save_char_tokenizer(too_small)
    return hf, converted, too_small, raw


def test_a_model_directory_brings_its_tokenizer_unless_the_command_line_names_one(dirs, tmp_path):
    _, converted, _, raw = dirs
    cfg = rj.load_config("sft_math", [f"actor.model.path={converted}", f"runner.output_dir={tmp_path}", *SMALL])
    assert cfg.data.tokenizer == str(converted)  # the recipe says char
    explicit = rj.load_config("sft_math", [f"actor.model.path={converted}", "data.tokenizer=char", *SMALL])
    assert explicit.data.tokenizer == "char"
    assert rj.load_config("sft_math", SMALL).data.tokenizer == "char"  # a fresh model keeps the recipe's

    # The batch the run trains on: prompts and targets in the model's ids.
    trainer = SFTTrainer(cfg)
    try:
        batch = {k: np.asarray(v) for k, v in trainer.next_batch().items()}
    finally:
        trainer.close()
    char = CharTokenizer()
    for ids, mask, tokens, rmask in zip(batch["prompt_ids"], batch["prompt_mask"], batch["tokens"],
                                        batch["response_mask"]):
        prompt = ids[mask == 1].tolist()
        text = raw.decode(prompt)
        assert raw.encode(text).ids == prompt and prompt != char.encode(text, add_special_tokens=False)
        target = tokens[rmask == 1].tolist()
        assert target[-1] == raw.token_to_id("<eos>")
        assert raw.decode(target[:-1]).startswith("\\boxed{") and target[:-1] == raw.encode(raw.decode(target[:-1])).ids


def test_the_documented_command_trains_with_the_models_tokenizer(dirs, tmp_path):
    # README / docs/models.md: python -m rlinf_jax.train --config-name sft_math actor.model.path=converted
    _, converted, _, raw = dirs
    assert train_main(["--config-name", "sft_math", f"actor.model.path={converted}", "actor.optim.lr=1e-5",
                       "runner.max_steps=1", "runner.eval_interval=0", "runner.save_interval=1",
                       f"runner.output_dir={tmp_path}", "runner.experiment_name=sft", *SMALL]) == 0
    run = tmp_path / "sft"
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["tokenizer"] == str(converted)
    loss = rj.read_metrics(run).last("train/loss")
    assert loss is not None and np.isfinite(loss)
    # The run's sampler reads the same ids.
    assert rj.restore(run).tokenizer.encode("2+3=") == raw.encode("2+3=").ids


def test_a_tokenizer_larger_than_the_models_vocabulary_is_one_line(dirs, tmp_path, capsys):
    _, _, too_small, _ = dirs
    assert train_main(["--config-name", "sft_math", f"actor.model.path={too_small}", "runner.max_steps=1",
                       f"runner.output_dir={tmp_path}", *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err[-2000:]
    assert "has 99 ids" in err and "holds 97" in err and "data.tokenizer" in err


def greedy(model_dir, prompt: str, n: int) -> str:
    """Greedy text by the plainest loop: the whole sequence through the model (no cache),
    the argmax appended, until the end token or ``n`` tokens. The sequence sits in a buffer
    of fixed width, so the forward compiles once; causal attention keeps the padding on
    the right out of every earlier position's logits."""
    model, tok = load_converted(model_dir), load_tokenizer(model_dir)
    ids = tok.encode(PromptTemplate("math").render(prompt))  # the template evaluate gives a model directory
    forward = nnx.jit(lambda m, x: m(x))
    buf = np.full((1, len(ids) + n), tok.pad_token_id, np.int32)
    buf[0, : len(ids)] = ids
    new = []
    for t in range(len(ids), len(ids) + n):
        nxt = int(jnp.argmax(forward(model, jnp.asarray(buf))[0, t - 1]))
        buf[0, t] = nxt
        new.append(nxt)
        if nxt == tok.eos_token_id:
            break
    return tok.decode(new, skip_special_tokens=True)


def test_restore_samples_a_model_directory(dirs):
    hf, converted, _, raw = dirs
    sampler = rj.restore(converted)
    assert isinstance(sampler, rj.LMSampler) and sampler.checkpoint == str(converted)
    assert sampler.tokenizer.encode("2+3=") == raw.encode("2+3=").ids
    text = sampler(["2+3="], max_new_tokens=8)
    assert len(text) == 1 and isinstance(text[0], str) and text[0]
    assert text == [greedy(converted, "2+3=", 8)]
    # The Hugging Face directory it came from: the same weights, the same text.
    assert rj.restore(hf)("2+3=", max_new_tokens=8) == text
    # Overrides reach the settings, as evaluate --checkpoint's do.
    assert rj.restore(converted, ["data.template=plain"]).config.data.template == "plain"

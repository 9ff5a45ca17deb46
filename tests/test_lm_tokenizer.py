"""load_tokenizer keeps a checkpoint's tokenizer.json pipeline intact (spaces survive), even
when tokenizer_config.json names a class transformers would rebuild it as."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from rlinf_jax.errors import BadInput
from rlinf_jax.data import load_tokenizer

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "what is 12 plus 30? the answer is 42.",
    "Hello world, hello tokenizer!",
]


@pytest.fixture
def tokenizer_dir(tmp_path):
    # A Metaspace BPE: transformers 5's AutoTokenizer rebuilds this as Qwen2Tokenizer with a
    # byte-level pipeline and decodes "the quick brown fox" as "thequickbrownfox".
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<|endoftext|>"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    # What a Qwen2 checkpoint ships: the config names Qwen2Tokenizer.
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|endoftext|>", "model_max_length": 512})
    )
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return tmp_path, tok


def test_round_trip_keeps_spaces(tokenizer_dir):
    path, raw = tokenizer_dir
    tok = load_tokenizer(path)
    for text in ["the quick brown fox", "what is 30 plus 12?", "Hello world, hello tokenizer!"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text).ids  # the trained pipeline, not a rebuilt one
        assert tok.decode(ids) == text


def test_special_tokens_and_left_padding(tokenizer_dir):
    path, raw = tokenizer_dir
    tok = load_tokenizer(path)
    eos = raw.token_to_id("<|endoftext|>")
    assert tok.eos_token_id == eos and tok.pad_token_id == eos
    batch = tok(["the dog", "the quick brown fox"], padding=True)
    short = batch["input_ids"][0]
    assert batch["attention_mask"][0][0] == 0 and short[0] == eos  # padded on the left
    n = sum(batch["attention_mask"][0])
    assert tok.decode(short[-n:]) == "the dog"


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(BadInput, match="tokenizer.json"):
        load_tokenizer(tmp_path)

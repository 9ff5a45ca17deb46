"""Reasoning data: the procedural generator (determinism, levels, answers against an independent
solver, disjoint splits), file datasets (JSONL / JSON / Parquet, custom and nested keys, every
bad-file case as one BadInput line), the resumable loader, templates and the char tokenizer."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rlinf_jax.data.char_tokenizer import CharTokenizer
from rlinf_jax.data.config import DataConfig
from rlinf_jax.data.datasets import (
    PromptLoader,
    ReasoningGymDataset,
    build_datasets,
    eval_batches,
    load_prompt_dataset,
)
from rlinf_jax.data.math_tasks import LEVELS, MathTaskGenerator, ProceduralMathDataset, heldout_bucket
from rlinf_jax.data.templates import MATH_INSTRUCTION, PromptTemplate, boxed_response
from rlinf_jax.data.tokenizers import get_tokenizer
from rlinf_jax.errors import BadInput

# ---------------------------------------------------------------- procedural generator


def _solve(prompt: str) -> int:
    """An independent solver: Python's own arithmetic for expressions, phrase rules for the
    word problems."""
    m = re.fullmatch(r"What is ([\d+\-*() ]+)\?", prompt)
    if m:
        return eval(m.group(1), {"__builtins__": {}})  # only digits, + - * ( ) and spaces
    nums = [int(x) for x in re.findall(r"\d+", prompt)]
    if "in each bag" in prompt:
        return nums[0] * nums[1]
    if "equally among" in prompt:
        assert nums[0] % nums[1] == 0
        return nums[0] // nums[1]
    if "buys" in prompt and "gives" in prompt:
        return nums[0] + nums[1] - nums[2]
    if "buys" in prompt:
        return nums[0] + nums[1]
    if "gives" in prompt:
        return nums[0] - nums[1]
    raise AssertionError(f"unrecognised problem: {prompt}")


def test_generator_is_deterministic_and_random_access():
    g = MathTaskGenerator(levels=(1, 2, 3, 4, 5), split="train", seed=7)
    first = g.take(50)
    assert first == MathTaskGenerator(levels=(1, 2, 3, 4, 5), split="train", seed=7).take(50)
    assert g.example(31) == first[31]  # any index on its own, no state carried between examples
    assert g.take(10, start=20) == first[20:30]
    other = MathTaskGenerator(levels=(1, 2, 3, 4, 5), split="train", seed=8).take(50)
    assert sum(a["prompt"] != b["prompt"] for a, b in zip(first, other)) > 40
    assert len({e["id"] for e in first}) == 50
    assert set(first[0]) == {"prompt", "answer", "level", "id"}


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_levels_have_their_shape_and_right_answers(level):
    examples = MathTaskGenerator(levels=(level,), split="train", seed=1).take(300)
    examples += MathTaskGenerator(levels=(level,), split="heldout", seed=1).take(100)
    for e in examples:
        assert e["level"] == level
        assert e["answer"] == str(_solve(e["prompt"])), e
        operands = [int(x) for x in re.findall(r"\d+", e["prompt"])]
        if level == 1:
            assert re.fullmatch(r"What is \d \+ \d\?", e["prompt"])
        elif level == 2:
            assert re.fullmatch(r"What is \d\d [+-] \d\d\?", e["prompt"]) and int(e["answer"]) >= 0
        elif level == 3:
            assert re.fullmatch(r"What is (\d{3} [+-] \d{3}|\d\d \* \d\d?)\?", e["prompt"])
        elif level == 4:
            assert 3 <= len(operands) <= 4 and "(" in e["prompt"] and all(1 <= x <= 20 for x in operands)
        else:
            assert e["prompt"].endswith("?") and int(e["answer"]) >= 0
    if level == 3:  # all three operations occur
        assert {op for e in examples for op in "+-*" if f" {op} " in e["prompt"]} == {"+", "-", "*"}


def test_splits_are_disjoint_on_a_large_sample():
    levels = tuple(LEVELS)
    train = {(e["prompt"], e["answer"]) for e in MathTaskGenerator(levels, "train", seed=0).take(20_000)}
    held = {(e["prompt"], e["answer"]) for e in MathTaskGenerator(levels, "heldout", seed=0).take(4_000)}
    assert len(held) > 1_000 and not train & held
    # Also against another train seed: disjointness does not depend on seeds.
    train2 = {(e["prompt"], e["answer"]) for e in MathTaskGenerator(levels, "train", seed=3).take(5_000)}
    assert not train2 & held


def test_level_one_space_is_partitioned_between_splits():
    # 100 single-digit sums: train and held-out together cover all of them, without overlap.
    train = {e["prompt"] for e in MathTaskGenerator((1,), "train").take(3_000)}
    held = {e["prompt"] for e in MathTaskGenerator((1,), "heldout").take(1_000)}
    expected_held = {f"What is {a} + {b}?" for a in range(10) for b in range(10) if heldout_bucket(f"1:{a} + {b}") < 0.2}
    assert held == expected_held and 5 <= len(held) <= 40
    assert train | held == {f"What is {a} + {b}?" for a in range(10) for b in range(10)}
    assert not train & held


def test_heldout_bucket_is_about_uniform():
    b = np.array([heldout_bucket(f"k{i}") for i in range(20_000)])
    assert abs((b < 0.2).mean() - 0.2) < 0.01 and 0.0 <= b.min() and b.max() < 1.0


def test_generator_rejects_bad_settings():
    for kwargs in ({"levels": ()}, {"levels": (6,)}, {"split": "test"}, {"heldout_fraction": 1.0}):
        with pytest.raises(BadInput):
            MathTaskGenerator(**kwargs)
    ds = ProceduralMathDataset(5, (1,), "train")
    assert len(ds) == 5 and ds[-1] == ds[4] and ds[1:3] == [ds[1], ds[2]]
    with pytest.raises(IndexError):
        ds[5]


# ---------------------------------------------------------------- file datasets


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_with_custom_and_nested_keys(tmp_path):
    rows = [
        {"question": "What is 2 + 2?", "sol": "4", "id": "q0"},
        {"question": "Half of 1?", "sol": 0.5},
        {"question": [{"role": "user", "content": "What is 3 * 3?"}], "sol": 9},
    ]
    ds = load_prompt_dataset(_jsonl(tmp_path / "d.jsonl", rows), prompt_key="question", answer_key="sol")
    assert len(ds) == 3
    assert ds[0] == {"prompt": "What is 2 + 2?", "answer": "4", "id": "q0"}
    assert ds[1]["answer"] == "0.5" and ds[1]["id"] == "d-1"
    assert ds[2]["prompt"][0]["content"] == "What is 3 * 3?" and ds[2]["answer"] == "9"
    nested = [{"prompt": "p", "reward_model": {"ground_truth": "12"}}]
    ds = load_prompt_dataset(_jsonl(tmp_path / "n.jsonl", nested), answer_key="reward_model.ground_truth")
    assert ds[0]["answer"] == "12"
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps([{"prompt": "x", "answer": "1"}, {"prompt": "y", "answer": "2"}]))
    assert [r["answer"] for r in load_prompt_dataset(arr)] == ["1", "2"]


def test_files_that_start_with_a_byte_order_mark_are_read(tmp_path):
    bom = b"\xef\xbb\xbf"
    lines = tmp_path / "bom.jsonl"
    lines.write_bytes(bom + b'{"prompt": "What is 2 + 2?", "answer": "4"}\n{"prompt": "And 3 + 3?", "answer": 6}\n')
    assert [(r["prompt"], r["answer"]) for r in load_prompt_dataset(lines)] == [("What is 2 + 2?", "4"), ("And 3 + 3?", "6")]
    array = tmp_path / "bom.json"
    array.write_bytes(bom + b'[{"prompt": "x", "answer": "1"}]')
    assert [r["answer"] for r in load_prompt_dataset(array)] == ["1"]


def test_parquet_with_custom_and_nested_keys(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "problem": ["What is 1 + 1?", "What is 5 - 2?"],
            "solution": ["2", "3"],
            "extra": [{"answer": "2"}, {"answer": "3"}],
            "unused": [1.0, 2.0],
        }
    )
    path = tmp_path / "d.parquet"
    pq.write_table(table, path)
    ds = load_prompt_dataset(path, prompt_key="problem", answer_key="solution")
    assert [r["prompt"] for r in ds] == ["What is 1 + 1?", "What is 5 - 2?"]
    assert [r["answer"] for r in ds] == ["2", "3"]
    ds = load_prompt_dataset(path, prompt_key="problem", answer_key="extra.answer")
    assert [r["answer"] for r in ds] == ["2", "3"]


def _bad_cases(tmp_path):
    """(path, kwargs, words the message must hold)"""
    cases = []
    cases.append((tmp_path / "missing.jsonl", {}, ["does not exist"]))
    (tmp_path / "empty.jsonl").write_text("")
    cases.append((tmp_path / "empty.jsonl", {}, ["empty"]))
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    cases.append((tmp_path / "blank.jsonl", {}, ["no records"]))
    (tmp_path / "adir.jsonl").mkdir()
    cases.append((tmp_path / "adir.jsonl", {}, ["directory"]))
    (tmp_path / "d.csv").write_text("prompt,answer\n")
    cases.append((tmp_path / "d.csv", {}, ["extension"]))
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage\x81")
    cases.append((tmp_path / "binary.jsonl", {}, ["UTF-8"]))
    (tmp_path / "badjson.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", answer: 2}\n')
    cases.append((tmp_path / "badjson.jsonl", {}, ["line 2", "not valid JSON"]))
    _jsonl(tmp_path / "nokey.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}, {"prompt": "c", "solution": "3"}])
    cases.append((tmp_path / "nokey.jsonl", {}, ["line 3", "'answer'", "solution", "data.answer_key"]))
    cases.append((tmp_path / "nokey.jsonl", {"prompt_key": "question"}, ["line 1", "'question'", "data.prompt_key"]))
    _jsonl(tmp_path / "intprompt.jsonl", [{"prompt": 5, "answer": "1"}])
    cases.append((tmp_path / "intprompt.jsonl", {}, ["line 1", "'prompt' is int"]))
    _jsonl(tmp_path / "listanswer.jsonl", [{"prompt": "a", "answer": "1"}, {"prompt": "a", "answer": [1, 2]}])
    cases.append((tmp_path / "listanswer.jsonl", {}, ["line 2", "'answer' is list"]))
    _jsonl(tmp_path / "nullanswer.jsonl", [{"prompt": "a", "answer": None}])
    cases.append((tmp_path / "nullanswer.jsonl", {}, ["'answer' is null"]))
    _jsonl(tmp_path / "boolanswer.jsonl", [{"prompt": "a", "answer": True}])
    cases.append((tmp_path / "boolanswer.jsonl", {}, ["'answer' is bool"]))
    (tmp_path / "notobj.jsonl").write_text('{"prompt": "a", "answer": "1"}\n[1, 2]\n')
    cases.append((tmp_path / "notobj.jsonl", {}, ["line 2", "JSON object"]))
    _jsonl(tmp_path / "badmsgs.jsonl", [{"prompt": [{"role": "user"}], "answer": "1"}])
    cases.append((tmp_path / "badmsgs.jsonl", {}, ["line 1", "messages"]))
    (tmp_path / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet at all")
    cases.append((tmp_path / "corrupt.parquet", {}, ["Parquet"]))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"problem": ["a"], "answer": ["1"]}), tmp_path / "nocol.parquet")
        cases.append((tmp_path / "nocol.parquet", {}, ["no column 'prompt'", "problem", "data.prompt_key"]))
        pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), tmp_path / "zero.parquet")
        cases.append((tmp_path / "zero.parquet", {}, ["no records"]))
        pq.write_table(pa.table({"prompt": ["a", None], "answer": ["1", "2"]}), tmp_path / "nullprompt.parquet")
        cases.append((tmp_path / "nullprompt.parquet", {}, ["row 2", "'prompt' is null"]))
    except ImportError:
        pass
    return cases


def test_every_bad_file_is_one_badinput_line(tmp_path):
    cases = _bad_cases(tmp_path)
    assert len(cases) >= 17
    for path, kwargs, words in cases:
        with pytest.raises(BadInput) as e:
            load_prompt_dataset(path, **kwargs)
        msg = str(e.value)
        assert "\n" not in msg and str(path) in msg, msg
        for w in words:
            assert w in msg, (w, msg)


# ---------------------------------------------------------------- loader and cursor


def test_loader_epochs_cover_the_data_and_resume_exactly():
    ds = ProceduralMathDataset(23, (1, 2), "train", seed=0)
    loader = PromptLoader(ds, batch_size=5, seed=11)
    seen = [next(loader).indices for _ in range(13)]  # 4 batches per epoch (3 records dropped)
    # Reference: each epoch's permutation, cut into whole batches, by hand.
    expected = []
    for epoch in range(4):
        perm = np.random.default_rng([11, epoch]).permutation(23)
        expected += [perm[i : i + 5] for i in range(0, 20, 5)]
    for got, want in zip(seen, expected[:13]):
        np.testing.assert_array_equal(got, want)
    for e in range(3):
        epoch = np.concatenate(seen[4 * e : 4 * e + 4])
        assert len(set(epoch.tolist())) == 20  # no repeats within an epoch

    # Stop after 6 batches, save, restore into a fresh loader: the next 7 are the same.
    a = PromptLoader(ds, batch_size=5, seed=11)
    for _ in range(6):
        next(a)
    state = json.loads(json.dumps(a.state_dict()))  # survives a JSON checkpoint
    b = PromptLoader(ds, batch_size=5, seed=11)
    b.load_state_dict(state)
    for i in range(6, 13):
        batch = next(b)
        np.testing.assert_array_equal(batch.indices, seen[i])
        assert batch.prompts == [ds[int(j)]["prompt"] for j in seen[i]]
        assert batch.answers == [ds[int(j)]["answer"] for j in seen[i]]
    with pytest.raises(BadInput, match="resume with the data settings"):
        PromptLoader(ProceduralMathDataset(24, (1,)), 5, seed=11).load_state_dict(state)


def test_loader_without_shuffle_and_eval_batches():
    ds = ProceduralMathDataset(7, (1,), "heldout")
    loader = PromptLoader(ds, batch_size=3, shuffle=False)
    assert [next(loader).indices.tolist() for _ in range(3)] == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]
    batches = list(eval_batches(ds, 3))
    assert [b.indices.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [i for b in batches for i in b.ids] == [ds[i]["id"] for i in range(7)]
    with pytest.raises(BadInput):
        PromptLoader(ds, batch_size=8)


# ---------------------------------------------------------------- config and sources


def test_data_config_builds_each_source(tmp_path):
    train, ev = build_datasets(DataConfig(train_levels=(1,), eval_levels=(2,), train_size=50, eval_size=10))
    assert len(train) == 50 and len(ev) == 10 and {e["level"] for e in ev} == {2}
    _jsonl(tmp_path / "t.jsonl", [{"q": "a", "a": "1"}])
    train, ev = build_datasets(DataConfig(source="files", train_path=str(tmp_path / "t.jsonl"), prompt_key="q", answer_key="a"))
    assert train[0]["answer"] == "1" and ev is None
    for bad in (
        {"source": "web"},
        {"source": "files"},
        {"source": "reasoning_gym"},
        {"train_levels": (0,)},
        {"heldout_fraction": 0.0},
        {"eval_size": 0},
        {"template": "no placeholder"},
        {"answer_key": ""},
    ):
        with pytest.raises(BadInput) as e:
            DataConfig(**bad).validate()
        assert "\n" not in str(e.value)


def test_reasoning_gym_source():
    pytest.importorskip("reasoning_gym")
    train, ev = build_datasets(DataConfig(source="reasoning_gym", reasoning_gym_task="basic_arithmetic", train_size=20, eval_size=5))
    assert len(train) == 20 and len(ev) == 5
    for rec in list(train) + list(ev):
        expr = re.search(r"Calculate (.*?)\.?$", rec["prompt"]).group(1)
        assert set(expr) <= set("0123456789+-*/() ")
        assert float(rec["answer"]) == pytest.approx(eval(expr, {"__builtins__": {}}))
    with pytest.raises(BadInput, match="reasoning_gym_task"):
        ReasoningGymDataset("no_such_task", 5)


# ---------------------------------------------------------------- templates


def test_plain_math_and_custom_templates():
    assert PromptTemplate("plain").render("What is 2 + 2?") == "What is 2 + 2?"
    assert PromptTemplate("math").render("What is 2 + 2?") == "What is 2 + 2?\n" + MATH_INSTRUCTION
    assert "\\boxed{}" in MATH_INSTRUCTION
    t = PromptTemplate("Q: {prompt}\nA: \\boxed{")
    assert t.render_batch(["1+1", "2+2"]) == ["Q: 1+1\nA: \\boxed{", "Q: 2+2\nA: \\boxed{"]
    assert boxed_response("12") == "\\boxed{12}"
    with pytest.raises(BadInput, match="chat template"):
        PromptTemplate("plain").render([{"role": "user", "content": "hi"}])
    with pytest.raises(BadInput, match="use_chat_template=false"):
        PromptTemplate("plain", use_chat_template=True, tokenizer=CharTokenizer())


def test_chat_template_through_a_real_tokenizer():
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    t = PromptTemplate("math", use_chat_template=True, system_prompt="Be brief.", tokenizer=tok)
    assert t.render("What is 2 + 2?") == (
        "<|system|>Be brief.<|end|><|user|>What is 2 + 2?\n" + MATH_INSTRUCTION + "<|end|><|assistant|>"
    )
    # Message prompts are used as given (the text template is not applied to them).
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert PromptTemplate("math", tokenizer=tok).render(msgs) == "<|system|>S<|end|><|user|>U<|end|><|assistant|>"


# ---------------------------------------------------------------- character tokenizer


def test_char_tokenizer_round_trip_and_ids():
    tok = get_tokenizer("char")
    assert isinstance(tok, CharTokenizer)
    assert tok.vocab_size == len(tok) == 100
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2) == (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)
    text = "What is (12 + 7) * 3?\nAnswer: \\boxed{57}. {x_1^2} ~`!@#$%&|<>;:'\""
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    every = "".join(chr(c) for c in range(32, 127)) + "\n"
    assert tok.decode(tok.encode(every)[1:]) == every
    assert len(set(tok.encode(every, add_special_tokens=False))) == 96
    # "\n" is id 4, " " id 5, then ASCII order: "0" = 5 + (48 - 32) = 21, "A" = 5 + 33 = 38.
    assert tok.encode("0A \n") == [1, 21, 38, 5, 4]
    assert tok.encode("é", add_special_tokens=False) == [tok.unk_id]
    ids = [tok.bos_id, *tok.encode("42", add_special_tokens=False), tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == "<bos>42<eos><pad>"
    assert tok.decode(ids, skip_special_tokens=True) == "42"
    assert tok.batch_decode([ids, ids[:2]], skip_special_tokens=True) == ["42", "4"]
    assert tok.decode([21, 100, 7 * 1000, -1, 21]) == "0<unk><unk><unk>0"  # ids past the vocabulary
    assert tok.decode(np.array([[21, 100]]), skip_special_tokens=True) == "0"


def test_char_tokenizer_left_padding():
    tok = CharTokenizer()
    ids, mask = tok.batch_encode(["1+1", "10+20", ""])
    c = {ch: tok.encode(ch, add_special_tokens=False)[0] for ch in "0123+"}
    b, p = tok.bos_id, tok.pad_id
    np.testing.assert_array_equal(
        ids,
        [
            [p, p, b, c["1"], c["+"], c["1"]],
            [b, c["1"], c["0"], c["+"], c["2"], c["0"]],
            [p, p, p, p, p, b],
        ],
    )
    np.testing.assert_array_equal(mask, [[0, 0, 1, 1, 1, 1], [1] * 6, [0, 0, 0, 0, 0, 1]])
    assert ids.dtype == np.int32 and mask.dtype == np.int32
    # Fixed width: short rows pad, long rows keep their right end.
    ids, mask = tok.batch_encode(["12345", "1"], max_length=3, add_special_tokens=False)
    np.testing.assert_array_equal(ids, [[c["3"], tok.encode("4", False)[0], tok.encode("5", False)[0]], [p, p, c["1"]]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1]])
    # The transformers-style call gives the same arrays.
    out = tok(["1+1", "10+20", ""], padding=True, return_tensors="np")
    ref_ids, ref_mask = tok.batch_encode(["1+1", "10+20", ""])
    np.testing.assert_array_equal(out["input_ids"], ref_ids)
    np.testing.assert_array_equal(out["attention_mask"], ref_mask)
    assert tok("12", add_special_tokens=False) == {"input_ids": [c["1"], c["2"]], "attention_mask": [1, 1]}
    with pytest.raises(BadInput, match="padding=True"):
        tok(["1", "12"], return_tensors="np")

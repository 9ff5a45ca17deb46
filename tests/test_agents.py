"""Agentic host pieces: the calculator against exact arithmetic, the tool-call syntax, the
search tool, the tool executor's pool and time limits, and a tool environment's episode."""

from __future__ import annotations

import random
import time
from fractions import Fraction

import pytest

from rlinf_jax.agents import (
    AgentConfig,
    CalculatorError,
    FormatError,
    SearchTool,
    ToolBox,
    ToolCall,
    ToolEnv,
    ToolExecutor,
    calculator,
    calculator_tool,
    evaluate,
    load_documents,
    parse_turn,
    search_tool,
    step_batch,
)
from rlinf_jax.agents.tools import Tool
from rlinf_jax.errors import BadInput


def _random_expression(rng, depth):
    """``(text, exact value)`` of a random expression, the value computed while building it."""
    if depth == 0 or rng.random() < 0.3:
        n = rng.randint(0, 99)
        return str(n), Fraction(n)
    a, va = _random_expression(rng, depth - 1)
    b, vb = _random_expression(rng, depth - 1)
    op = rng.choice("+-*/")
    if op == "/" and vb == 0:
        op = "+"
    value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else None}[op]
    text = f"({a}){op}({b})" if rng.random() < 0.5 else f"( {a} ) {op} ( {b} )"
    return text, value


def test_calculator_matches_exact_arithmetic():
    rng = random.Random(0)
    for _ in range(300):
        text, value = _random_expression(rng, 3)
        assert evaluate(text) == value, text
    assert calculator("12*34") == "408"
    assert calculator("-(3 - 10) * 2") == "14"
    assert calculator("1/3") == "0.333333"
    assert calculator("2.5*4") == "10"


@pytest.mark.parametrize(
    "text",
    ["2**10", "__import__('os').system('true')", "x+1", "1/0", "(" * 500 + "1" + ")" * 500, "9" * 10 + "*" + "9" * 10,
     "", "1 < 2", "[1, 2]", "1 +", "abs(-1)", "+".join(["1"] * 150)],
)
def test_calculator_refuses_what_is_not_bounded_arithmetic(text):
    with pytest.raises(CalculatorError):
        evaluate(text)


@pytest.mark.parametrize("text", ["1e999", "-1e999", "1e999 - 1e999", "9" * 200, "1" + "0" * 18, "1e18", "1e300"])
def test_numbers_past_the_size_cap_are_the_tools_own_error(text):
    # Written numbers obey the cap results do; 1e999 parses as float infinity.
    with pytest.raises(CalculatorError, match="number too large"):
        calculator(text)
    with ToolExecutor(ToolBox([calculator_tool()]), num_workers=0, timeout_s=1.0) as ex:
        outcome = ex.run([ToolCall("calculator", text)])[0]
    assert not outcome.ok and outcome.text == "CalculatorError: number too large"


def test_numbers_just_below_the_size_cap_still_compute():
    assert calculator("9" * 18) == "9" * 18
    assert calculator("1e17 + 1") == "100000000000000001"
    assert calculator("1e-999") == "0"


def test_tool_call_syntax():
    assert parse_turn("let me compute <tool>calculator: 12*34</tool>") == ToolCall("calculator", "12*34")
    assert parse_turn("<tool>a: 1</tool> then <tool>search: two words</tool>") == ToolCall("search", "two words")
    assert parse_turn("the answer is 408") is None
    for bad in ["<tool>calculator 12*34</tool>", "<tool>calculator: 1", "</tool>", "<tool>1x: 2</tool>"]:
        assert isinstance(parse_turn(bad), FormatError), bad


def test_tool_names_are_capped_and_an_unknown_name_is_echoed_cut():
    assert parse_turn(f"<tool>{'a' * 64}: 1</tool>") == ToolCall("a" * 64, "1")
    assert parse_turn(f"<tool>{'a' * 65}: 1</tool>") == FormatError("tool name longer than 64 characters")
    with pytest.raises(BadInput, match="longer than 64 characters"):
        ToolBox([Tool("t" * 65, "", str)])
    long_name = "x" * 5000
    with ToolExecutor(ToolBox([calculator_tool()]), num_workers=0, timeout_s=1.0) as ex:
        text = ex.run([ToolCall(long_name, "1")])[0].text
    # The error keeps the list of tools the model can call, not 5000 echoed characters.
    assert text == f"LookupError: unknown tool '{'x' * 64}'...; tools: calculator"


def test_search_tool_ranks_by_bm25(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    facts = {"zorbia.txt": "The capital of Zorbia is Quellton.", "fruit.md": "Bananas are yellow fruits.",
             "bridges.txt": "Quellton has four stone bridges."}
    for name, text in facts.items():
        (docs / name).write_text(text)
    tool = SearchTool.from_path(docs)
    assert tool("capital of Zorbia") == facts["zorbia.txt"]
    assert tool("stone bridges") == facts["bridges.txt"]
    assert tool("xylophone") == "no results"
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"title": "Zorbia", "text": "Its flag is green."}\n')
    assert load_documents(jsonl) == ["Zorbia: Its flag is green."]
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "Quellton is old."}\n')
    assert load_documents(tmp_path / "bom.jsonl") == ["Quellton is old."]
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(BadInput, match="bad.jsonl:1"):
        load_documents(tmp_path / "bad.jsonl")
    with pytest.raises(BadInput):
        load_documents(tmp_path / "missing")


def sleepy(arguments):
    time.sleep(float(arguments))
    return "woke"


def test_executor_runs_calls_in_the_pool_with_time_limits():
    tools = ToolBox([calculator_tool(), search_tool(SearchTool(["alpha beta", "gamma delta"])), Tool("sleep", "", sleepy)])
    # A limit generous enough for a loaded machine's worker to answer the quick calls in,
    # far below the sleeping call's.
    with ToolExecutor(tools, num_workers=2, timeout_s=3.0) as ex:
        out = ex.run([
            ToolCall("calculator", "12*34"), ToolCall("search", "gamma"), ToolCall("sleep", "60"),
            ToolCall("nope", "x"), ToolCall("calculator", "1/0"), ToolCall("sleep", "0"),
        ])
        assert [o.ok for o in out] == [True, True, False, False, False, True]
        assert out[0].text == "408" and out[1].text == "gamma delta" and out[5].text == "woke"
        assert out[2].timed_out and "timed out" in out[2].text
        assert "unknown tool" in out[3].text and "division by zero" in out[4].text
        assert ex.run([ToolCall("calculator", "2+2")])[0].text == "4"  # the pool lives on after a timeout


def test_tool_env_episode_and_batch():
    with ToolExecutor(ToolBox([calculator_tool()]), num_workers=0, timeout_s=1.0) as ex:
        env = ToolEnv(ex, max_turns=3)
        assert env.reset({"prompt": "What is 12*34?", "answer": "408"}) == "What is 12*34?"
        r = env.step("<tool>calculator: 12*34</tool>")
        assert (r.observation, r.reward, r.done, r.info["tool_call"]) == ("<result>408</result>", 0.0, False, True)
        r = env.step("<tool>calculator 12*34</tool>")
        assert r.observation.startswith("<error>") and r.info["format_error"] and not r.done
        r = env.step("\\boxed{408}")
        assert (r.observation, r.reward, r.done) == ("", 1.0, True)

        envs = [ToolEnv(ex, max_turns=1), ToolEnv(ex, max_turns=2), ToolEnv(ex, max_turns=2)]
        for e in envs:
            e.reset({"prompt": "p", "answer": "7"})
        out = step_batch(envs, ["<tool>calculator: 3+4</tool>", "<tool>calculator: 1/0</tool>", "7"])
        assert out[0].done and out[0].info["truncated"] and out[0].reward == 0.0
        assert not out[1].done and out[1].info["tool_error"] and out[1].observation.startswith("<error>")
        assert out[2].done and out[2].reward == 1.0


def test_agent_config_checks():
    AgentConfig().validate()
    for bad in [dict(tools=["shell"]), dict(tools=["search"]), dict(max_turns=0), dict(advantage_mode="step"),
                dict(tool_timeout_s=0)]:
        with pytest.raises(BadInput):
            AgentConfig(**bad).validate()


def test_tool_task_transcripts_solve_their_problems_and_splits_are_disjoint():
    import re

    from rlinf_jax.data.tool_tasks import ToolTaskDataset

    train = ToolTaskDataset(400, (1, 2, 3), "train", seed=3)
    held = ToolTaskDataset(100, (1, 2, 3), "heldout", seed=3)
    assert {r["prompt"] for r in train} & {r["prompt"] for r in held} == set()
    assert {r["level"] for r in train} == {1, 2, 3}
    with ToolExecutor(ToolBox([calculator_tool()]), num_workers=0) as ex:
        for rec in [*train[:60], *held[:20]]:
            # Replaying the transcript through the environment: every call's result is the
            # calculator's, and the final answer scores 1.
            env = ToolEnv(ex, max_turns=3)
            env.reset(rec)
            turns = re.split(r"(?<=</tool>)<result>[^<]*</result>", rec["target"])
            results = re.findall(r"<result>([^<]*)</result>", rec["target"])
            for turn, expected in zip(turns, results):
                assert env.step(turn).observation == f"<result>{expected}</result>"
            final = env.step(turns[-1])
            assert final.done and final.reward == 1.0, rec
    assert "target" not in ToolTaskDataset(5, (1,), transcripts=False)[0]


def test_tool_fraction_keeps_the_problems_and_drops_transcripts_on_its_share():
    from rlinf_jax.data.config import DataConfig
    from rlinf_jax.data.datasets import build_datasets
    from rlinf_jax.data.tool_tasks import ToolTaskDataset

    full = ToolTaskDataset(400, (1, 3), "train", seed=2)
    part = ToolTaskDataset(400, (1, 3), "train", seed=2, tool_fraction=0.3)
    assert [r["prompt"] for r in part] == [r["prompt"] for r in full]
    with_tool = [r for r in part if "target" in r]
    assert 0.2 < len(with_tool) / len(part) < 0.4
    assert all(r["target"] == f["target"] for r, f in zip(part, full) if "target" in r)
    assert all("target" not in r for r in ToolTaskDataset(50, (1,), seed=2, tool_fraction=0.0))
    # The recipe key reaches the train split only: held-out records are the same at every fraction.
    cfg = DataConfig(source="tool_calc", train_levels=[1], eval_levels=[1], train_size=100, eval_size=20,
                     sft_tool_fraction=0.5)
    train, held = build_datasets(cfg)
    assert train.tool_fraction == 0.5 and list(held) == list(ToolTaskDataset(20, (1,), "heldout"))
    for bad in (-0.1, 1.5):
        with pytest.raises(BadInput):
            DataConfig(source="tool_calc", sft_tool_fraction=bad).validate()
        with pytest.raises(BadInput):
            ToolTaskDataset(5, (1,), tool_fraction=bad)


def test_search_task_transcripts_replay_through_the_search_tool_and_held_out_towns_are_new(tmp_path):
    import re

    from rlinf_jax.agents import executor_from_config
    from rlinf_jax.data.search_tasks import NUM_TOWNS, ToolSearchDataset, fact_documents, main, towns

    docs = fact_documents()
    assert len(docs) == 3 * NUM_TOWNS == len(set(docs)) and len({t for t, _ in towns()}) == NUM_TOWNS
    train = ToolSearchDataset(300, "train", seed=1)
    held = ToolSearchDataset(100, "heldout", seed=1)
    town = re.compile(r"search: (\w+) ")
    train_towns = {town.search(r["target"]).group(1) for r in train}
    held_towns = {town.search(r["target"]).group(1) for r in held}
    assert train_towns and held_towns and not train_towns & held_towns
    with executor_from_config(AgentConfig(tools=["search"], search_documents="facts", num_workers=0)) as ex:
        for rec in [*train[:30], *held[:30]]:
            # The transcript's search finds the fact it quotes, and its answer scores 1.
            env = ToolEnv(ex, max_turns=2)
            env.reset(rec)
            call, result, answer = re.fullmatch(r"(.*</tool>)<result>(.*)</result>(.*)", rec["target"]).groups()
            assert env.step(call).observation == f"<result>{result}</result>"
            assert result.endswith(" " + rec["answer"])
            final = env.step(answer)
            assert final.done and final.reward == 1.0, rec
    assert "target" not in ToolSearchDataset(5, transcripts=False)[0]
    # The collection written out for reading; an existing file is never overwritten.
    out = tmp_path / "facts.jsonl"
    assert main([str(out)]) == 0 and load_documents(out) == docs
    assert main([str(out)]) == 2 and load_documents(out) == docs

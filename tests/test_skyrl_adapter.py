"""SkyRL-gym environments behind the text-environment protocol (`rlinf_jax.agents.skyrl`):
against SkyRL's own environments stepped directly, in the multi-turn rollout, and in a
GRPO run (``agent.env=skyrl``)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

skyrl_gym = pytest.importorskip("skyrl_gym")

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402

from rlinf_jax.agents import StepResult  # noqa: E402
from rlinf_jax.agents.skyrl import SkyRLTextEnv  # noqa: E402
from rlinf_jax.errors import BadInput  # noqa: E402
from rlinf_jax.rollout.multi_turn import MultiTurnRollout, TurnLimits  # noqa: E402
from rlinf_jax.rollout.sampler import Sampler  # noqa: E402

from tests.test_multi_turn import TOK, _model  # noqa: E402


class LengthEnv(BaseTextEnv):
    """Rewards a turn by its length (mod 5, over 4) and answers with the turn's number;
    done after three turns: non-zero rewards from a random model."""

    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.max_turns = int(extras.get("max_turns", 3))

    def init(self, prompt):
        return [{"role": "system", "content": "count"}, *prompt], {}

    def step(self, action):
        self.turns += 1
        done = self.turns >= 3
        obs = [] if done else [{"role": "user", "content": f"turn {self.turns} of {len(action)}"}]
        return BaseTextEnvStepOutput(observations=obs, reward=(len(action) % 5) / 4, done=done,
                                     metadata={"length": len(action)})


if "rlinf_test_length" not in skyrl_gym.registry:
    skyrl_gym.register(id="rlinf_test_length", entry_point=LengthEnv)


def test_gsm8k_multi_turn_scores_as_skyrl_does():
    env = SkyRLTextEnv("gsm8k_multi_turn", max_turns=4)
    assert env.reset({"prompt": "What is 6*7?", "answer": "42"}) == "What is 6*7?"
    # A well-formatted wrong answer: SkyRL's format score 0.2 spread over the 4 turns.
    first = env.step("I think #### 41")
    assert first.reward == pytest.approx(0.2 / 4) and not first.done
    assert first.observation.startswith("\nPlease provide your step-by-step reasoning")
    assert env.step("no answer here").reward == 0.0
    last = env.step("#### 42")
    assert last == StepResult("", 1.0, True, {})
    assert env.env is None  # closed with its episode


def test_reset_renders_what_the_environment_init_returns():
    env = SkyRLTextEnv("rlinf_test_length", max_turns=3)
    assert env.reset({"prompt": "hi"}) == "count\nhi"
    assert env.step("abcdefg") == StepResult("\nturn 1 of 7", 0.5, False, {"length": 7})


def test_unknown_ids_and_rows_without_prompts_are_bad_input():
    from rlinf_jax.agents.skyrl import check_env_id

    with pytest.raises(BadInput, match="gsm8k_multi_turn"):
        check_env_id("no_such_env")
    with pytest.raises(BadInput, match="prompt"):
        SkyRLTextEnv("gsm8k_multi_turn", 2).reset({"answer": "1"})


def test_rollout_episodes_replay_through_skyrl_itself():
    sampler = Sampler(_model(), pad_id=TOK.pad_id)
    limits = TurnLimits(max_turns=3, max_turn_tokens=10, max_observation_tokens=12, max_episode_tokens=60)
    rows = [{"prompt": p} for p in ("12*34=", "count to three", "a", "why?")]
    rollout = MultiTurnRollout(sampler, TOK, limits, stop_string="")
    ep = rollout.run([SkyRLTextEnv("rlinf_test_length", 3) for _ in rows], rows, jax.random.key(0), temperature=1.0)
    assert ep.rewards.sum() > 0
    for b, row in enumerate(rows):
        # SkyRL's environment stepped by hand with the model's texts of the episode.
        env = skyrl_gym.make("rlinf_test_length", env_config={}, extras={"max_turns": 3})
        env.init([{"role": "user", "content": row["prompt"]}])
        outs = [env.step(text) for text in ep.texts[b]]
        assert ep.turn_rewards[b] == [o["reward"] for o in outs]
        assert ep.rewards[b] == pytest.approx(sum(o["reward"] for o in outs))
        assert [i["length"] for i in ep.infos[b]] == [len(t) for t in ep.texts[b]]
        # The observation tokens in the episode are SkyRL's messages, one per line.
        observed = ep.tokens[b][(ep.valid[b] == 1) & (ep.loss_mask[b] == 0)].tolist()
        # (each cut to max_observation_tokens).
        expected = [tok for o in outs if not o["done"]
                    for tok in TOK.encode("\n" + o["observations"][0]["content"], add_special_tokens=False)[:12]]
        assert observed == expected
    assert set(ep.num_turns.tolist()) == {3}


@pytest.mark.slow
def test_a_grpo_run_on_a_skyrl_environment(tmp_path):
    from rlinf_jax.runtime import read_metrics

    from tests.test_agentic_flow import run

    assert run(tmp_path, "skyrl", "runner.max_steps=2", "runner.eval_interval=2", "sft.warm_start_steps=0",
               "agent.env=skyrl", "agent.skyrl_env=gsm8k_multi_turn") == 0
    last = read_metrics(tmp_path / "skyrl")[-1]
    # gsm8k_multi_turn answers every unfinished turn with an instruction: two turns, observed tokens.
    assert last["rollout/agent/turns"] == pytest.approx(2.0)
    assert last["rollout/agent/tokens_observed"] > 0 and last["eval/agent/tokens_observed"] > 0
    assert np.isfinite(last["train/loss"])
    # No tool calls are parsed for a SkyRL environment: its own step decides what a turn does.
    assert last["rollout/agent/tool_calls"] == 0
    # The evaluation CLI builds the same environment for the checkpoint.
    from rlinf_jax.cli.evaluate import main as evaluate

    out = tmp_path / "eval.json"
    assert evaluate(["--checkpoint", str(tmp_path / "skyrl"), "--out", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    assert report["accuracy"] == pytest.approx(last["eval/accuracy"])
    assert report["agent/tokens_observed"] == pytest.approx(last["eval/agent/tokens_observed"])


@pytest.mark.parametrize("extra, words", [
    (["agent.env=skyrl"], "agent.skyrl_env"),
    (["agent.env=skyrl", "agent.skyrl_env=nope"], "not a registered SkyRL-gym"),
    (["agent.env=gym"], "agent.env"),
])
def test_bad_skyrl_settings_are_one_line_errors(tmp_path, capsys, extra, words):
    from tests.test_agentic_flow import run

    assert run(tmp_path, "bad", *extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error:") and words in err[-1]

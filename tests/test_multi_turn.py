"""The multi-turn rollout: its loss mask against a hand-built episode, and KV reuse across
turns against re-running the model over the whole conversation at every token (greedy)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rlinf_jax.agents import StepResult
from rlinf_jax.data.char_tokenizer import CharTokenizer
from rlinf_jax.policies.lm.config import LMConfig
from rlinf_jax.policies.lm.model import CausalLM
from rlinf_jax.algos import kl_penalty, ppo_policy_loss
from rlinf_jax.policies.lm.logprobs import policy_logprobs
from rlinf_jax.rollout.multi_turn import MultiTurnRollout, TurnLimits, assemble, episode_metrics
from rlinf_jax.rollout.sampler import Sampler

TOK = CharTokenizer()


def test_assemble_matches_a_hand_built_episode():
    # prompt | "ab" (model) "<r>" (tool output) | "c" + eos (model)
    turns = [[10, 11], [12, 2]]
    obs = [[20, 21, 22]]
    tokens, loss, valid, logp, turn = assemble(turns, obs, 8, [np.array([-0.5, -0.25]), np.array([-1.0, -2.0])])
    np.testing.assert_array_equal(tokens, [10, 11, 20, 21, 22, 12, 2, 0])
    np.testing.assert_array_equal(loss, [1, 1, 0, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(valid, [1, 1, 1, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(turn, [0, 0, 0, 0, 0, 1, 1, -1])
    np.testing.assert_allclose(logp, [-0.5, -0.25, 0, 0, 0, -1.0, -2.0, 0])
    with pytest.raises(ValueError):
        assemble(turns, obs, 6)


class ScriptedEnv:
    """Answers every turn with an observation of its own length; done after ``stop_after`` turns
    or when the turn says ``quit``."""

    def __init__(self, obs_len, stop_after, max_turns):
        self.obs_len, self.stop_after, self.max_turns = obs_len, stop_after, max_turns

    def reset(self, row):
        self.turn = 0
        return row["prompt"]

    def step(self, text):
        self.turn += 1
        done = self.turn >= self.stop_after
        return StepResult("" if done else "o" * self.obs_len + f"{self.turn}", float(len(text)), done, {})


def _model(seed=0):
    config = LMConfig.from_hf_config({
        "model_type": "qwen2", "vocab_size": TOK.vocab_size, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "max_position_embeddings": 512, "tie_word_embeddings": True,
    })
    graphdef, state = nnx.split(CausalLM(config, rngs=nnx.Rngs(seed)))
    noise = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(state))))
    # Spread-out logits: greedy choices without near ties.
    state = jax.tree_util.tree_map_with_path(
        lambda path, x: jax.random.normal(next(noise), x.shape) * 0.4 + ("norm" in jax.tree_util.keystr(path)), state
    )
    return nnx.merge(graphdef, state)


def _reference(model, prompts, envs, rows, limits, stop_seq, eos):
    """Each row alone, the whole conversation re-run through the model (no cache) for every token."""
    width = 256

    @jax.jit
    def last_logprobs(ids, n):
        mask = jnp.arange(width)[None] < n
        logits = model(ids, mask.astype(jnp.int32))
        return jax.nn.log_softmax(logits[0, n - 1])

    out = []
    for prompt, env, row in zip(prompts, envs, rows):
        env.reset(row)
        conv, used, turns, obs_all, logps = list(prompt), 0, [], [], []
        for t in range(limits.max_turns):
            gen, lp = [], []
            for _ in range(min(limits.max_turn_tokens, limits.max_episode_tokens - used)):
                ids = np.zeros((1, width), np.int32)
                ids[0, : len(conv)] = conv
                logp = np.asarray(last_logprobs(ids, len(conv)))
                tok = int(np.argmax(logp))
                gen.append(tok), lp.append(logp[tok]), conv.append(tok)
                if tok == eos or (len(gen) >= len(stop_seq) and gen[-len(stop_seq):] == list(stop_seq)):
                    break
            turns.append(gen), logps.append(np.asarray(lp))
            used += len(gen)
            res = env.step(TOK.decode(gen, skip_special_tokens=True))
            if res.done:
                break
            obs = TOK.encode(res.observation, add_special_tokens=False)[: limits.max_observation_tokens]
            if t + 1 >= limits.max_turns or used + len(obs) >= limits.max_episode_tokens:
                break
            obs_all.append(obs)
            conv += obs
            used += len(obs)
        out.append((turns, obs_all, logps))
    return out


@pytest.mark.slow
def test_kv_reuse_equals_re_prefilling_the_whole_conversation(monkeypatch):
    from rlinf_jax.rollout import multi_turn

    # The cache starts with the first turn's columns and grows turn by turn.
    grown = []
    grow = multi_turn._grow
    monkeypatch.setattr(multi_turn, "_grow", lambda c, m, *, length: grown.append(length) or grow(c, m, length=length))
    model = _model()
    sampler = Sampler(model, pad_id=TOK.pad_id)
    limits = TurnLimits(max_turns=4, max_turn_tokens=12, max_observation_tokens=9, max_episode_tokens=60)
    rows = [{"prompt": p} for p in ["12*34=", "what is 7+8?", "a", "hello there, calculate 99*99", "x y"]]
    prompts = [TOK.encode(r["prompt"], add_special_tokens=False) for r in rows]

    def make_envs():
        # Different observation lengths and episode lengths: rows end at different turns.
        return [ScriptedEnv(obs_len=k + 1, stop_after=[4, 2, 4, 3, 1][k], max_turns=4) for k in range(5)]

    # A stop string the model really produces: two tokens from row 0's first turn.
    free = MultiTurnRollout(sampler, TOK, limits, stop_string="")
    first = free.run(make_envs(), rows, jax.random.key(0), temperature=0.0)
    turn0 = [t for t in first.tokens[0][first.turn_ids[0] == 0][first.loss_mask[0][first.turn_ids[0] == 0] == 1]]
    stop = next(TOK.decode(turn0[i : i + 2]) for i in range(3, len(turn0) - 1) if min(turn0[i : i + 2]) >= 4)

    rollout = MultiTurnRollout(sampler, TOK, limits, stop_string=stop)
    envs = make_envs()
    grown.clear()
    ep = rollout.run(envs, rows, jax.random.key(0), temperature=0.0)
    assert grown == sorted(set(grown)) and grown[-1] == rollout.columns(32)  # [96, 128, 144] here
    ref = _reference(model, prompts, make_envs(), rows, limits, rollout.stop_seq.tolist(), TOK.eos_id)
    assert any(len(t) < limits.max_turn_tokens for turns, _, _ in ref for t in turns[:-1]), "no turn ended on the stop string"
    assert len(set(ep.num_turns.tolist())) > 1, "every episode had the same number of turns"
    for b, (turns, obs, logps) in enumerate(ref):
        tokens, loss, valid, logp, turn = assemble(turns, obs, limits.max_episode_tokens, logps)
        np.testing.assert_array_equal(ep.tokens[b], tokens, err_msg=f"row {b}")
        np.testing.assert_array_equal(ep.loss_mask[b], loss)
        np.testing.assert_array_equal(ep.turn_ids[b], turn)
        np.testing.assert_allclose(ep.logprobs[b], logp, atol=2e-4)
        assert ep.num_turns[b] == len(turns)
        # Observation tokens are the environment's text, never the model's.
        obs_tokens = ep.tokens[b][(ep.valid[b] == 1) & (ep.loss_mask[b] == 0)]
        assert TOK.decode(obs_tokens.tolist()) == "".join(TOK.decode(o) for o in obs)

    # The trainer's view of the same episodes: the prompt left-padded, the response read
    # whole (observations included) and scored on the model's tokens only.
    P = max(map(len, prompts))
    prompt_ids = np.zeros((len(prompts), P), np.int32)
    prompt_mask = np.zeros((len(prompts), P), np.int32)
    for b, p in enumerate(prompts):
        prompt_ids[b, P - len(p):], prompt_mask[b, P - len(p):] = p, 1
    batch = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "tokens": ep.tokens,
             "response_mask": ep.loss_mask, "response_valid": ep.valid}
    logp, _ = policy_logprobs(model, batch)
    m = ep.loss_mask > 0
    np.testing.assert_allclose(np.asarray(logp)[m], ep.logprobs[m], atol=2e-4)

    # Observation tokens weigh nothing in the policy loss or the KL: any advantage, log-prob
    # or reference there leaves both unchanged.
    rng = np.random.default_rng(0)
    adv = rng.normal(size=ep.tokens.shape).astype(np.float32)
    ref_lp = np.asarray(logp) + rng.normal(size=ep.tokens.shape).astype(np.float32) * 0.1
    obs = (ep.valid > 0) & ~m
    assert obs.any()
    adv2, logp2, ref2 = adv.copy(), np.asarray(logp).copy(), ref_lp.copy()
    adv2[obs], logp2[obs], ref2[obs] = 100.0, 5.0, -7.0
    loss1, _ = ppo_policy_loss(jnp.asarray(logp), jnp.asarray(logp) - 0.05, adv, ep.loss_mask, 0.2, 0.2)
    loss2, _ = ppo_policy_loss(jnp.asarray(logp2), jnp.asarray(logp2) - 0.05, adv2, ep.loss_mask, 0.2, 0.2)
    np.testing.assert_allclose(loss1, loss2, rtol=1e-6)
    kl1 = np.asarray(kl_penalty(jnp.asarray(logp), ref_lp, "low_var_kl"))[m]
    kl2 = np.asarray(kl_penalty(jnp.asarray(logp2), ref2, "low_var_kl"))[m]
    np.testing.assert_allclose(kl1, kl2)

    stats = episode_metrics(ep)
    assert stats["agent/turns"] == pytest.approx(ep.num_turns.mean())
    assert stats["agent/tokens_generated"] == pytest.approx(ep.loss_mask.sum() / len(rows))
    assert stats["agent/tokens_observed"] == pytest.approx(sum(len(o) for _, obs, _ in ref for o in obs) / len(rows))


def test_sft_transcripts_mask_the_tool_results():
    from rlinf_jax.rollout.lm_io import encode_transcripts

    text = "<tool>calculator: 2*3</tool><result>6</result><tool>x</tool><error>bad</error>\\boxed{6}"
    ids, loss, valid = encode_transcripts(TOK, [text, "\\boxed{1}"], 96)
    scored = TOK.decode(ids[0][loss[0] > 0].tolist())
    read_only = TOK.decode(ids[0][(valid[0] > 0) & (loss[0] == 0)].tolist())
    assert scored == "<tool>calculator: 2*3</tool><tool>x</tool>\\boxed{6}<eos>"
    assert read_only == "<result>6</result><error>bad</error>"
    assert TOK.decode(ids[1][loss[1] > 0].tolist()) == "\\boxed{1}<eos>" and (loss[1] == valid[1]).all()
    with pytest.raises(Exception, match="max_new_tokens"):
        encode_transcripts(TOK, [text], 20)

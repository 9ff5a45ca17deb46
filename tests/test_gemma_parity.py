"""Our Gemma against transformers' GemmaForCausalLM on the same random weights.

The tiny model (rlinf_jax.policies.lm.tiny "gemma") has hidden 48, 3 query heads on 1 KV
head, head_dim 20, vocabulary 301, tied embeddings and every parameter random, so a missing
``1 +`` in the norms, an unscaled embedding or the exact (not tanh) GELU shows in the logits.
fp32 logits must agree to 1e-4 on a left-padded batch, the KV-cache sampler must pick
transformers' greedy tokens with the log-probs of its scores, and the converted / exported
directories must give back the same model.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.lm import (
    LMConfig,
    from_pretrained,
    load_converted,
    save_pretrained,
)
from rlinf_jax.policies.lm.tiny import save_tiny
from rlinf_jax.rollout.sampler import Sampler, SamplingParams
from tests.test_lm_parity import hf_logits, left_padded_batch

torch.set_num_threads(1)
VOCAB = 301


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    path, hf = save_tiny("gemma", tmp_path_factory.mktemp("gemma"))
    return path, hf, from_pretrained(path)


def left_padded(seed, batch, length, pads):
    # Real tokens from id 1: id 0 is the pad.
    return left_padded_batch(seed, batch, length, pads, vocab=VOCAB, low=1)


def test_config_reads_gemma_switches(gemma):
    path, _hf, model = gemma
    c = model.config
    assert (c.model_type, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == ("gemma", 48, 3, 1, 20)
    assert c.is_gemma and c.tie_word_embeddings and model.lm_head is None
    # transformers 4 files call the activation `hidden_activation`; legacy "gelu" means tanh GELU.
    hf = json.loads((path / "config.json").read_text())
    hf.pop("hidden_act", None)
    assert LMConfig.from_hf_config({**hf, "hidden_activation": "gelu"}).is_gemma
    with pytest.raises(BadInput, match="hidden_act"):
        LMConfig.from_hf_config({**hf, "hidden_act": "relu"})
    # GemmaConfig's defaults: head_dim 256 and tied embeddings when the file says nothing.
    bare = {k: v for k, v in hf.items() if k not in ("head_dim", "tie_word_embeddings")}
    assert LMConfig.from_hf_config(bare).head_dim == 256
    assert LMConfig.from_hf_config(bare).tie_word_embeddings


def test_fp32_logits_match_transformers(gemma):
    _path, hf, model = gemma
    ids, mask = left_padded(0, 3, 11, (0, 4, 1))
    ours = np.asarray(jax.jit(lambda m, i, k: m(i, k))(model, jnp.asarray(ids), jnp.asarray(mask)))
    ref = hf_logits(hf, ids, mask)
    valid = mask.astype(bool)
    err = np.abs(ours - ref)[valid].max()
    assert ours.shape == (3, 11, VOCAB) and err <= 1e-4, err
    # The check is not vacuous: the logits spread widely across the vocabulary.
    assert ref[valid].std() > 1.0


def test_sampler_matches_transformers_greedy_and_scores(gemma):
    _path, hf, model = gemma
    ids, mask = left_padded(2, 3, 7, (2, 0, 5))
    out = Sampler(model).generate(ids, mask, jax.random.key(0), SamplingParams(max_new_tokens=12, temperature=0.0))
    with torch.no_grad():
        ref = hf.generate(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), do_sample=False, max_new_tokens=12,
            pad_token_id=0, output_scores=True, return_dict_in_generate=True,
        )
    ref_tokens = ref.sequences[:, ids.shape[1] :].numpy()
    assert min(len(set(row)) for row in ref_tokens.tolist()) >= 4  # no collapse into one token
    np.testing.assert_array_equal(np.asarray(out.tokens), ref_tokens)
    ref_logp = torch.stack(ref.scores, 1).log_softmax(-1).gather(-1, torch.tensor(ref_tokens)[..., None])[..., 0]
    err = np.abs(np.asarray(out.logprobs) - ref_logp.numpy()).max()
    assert err <= 1e-4, err


def test_convert_and_export_round_trip(gemma, tmp_path):
    from rlinf_jax.policies.convert import gemma as gemma_convert

    path, hf, model = gemma
    out = gemma_convert.convert(path, tmp_path / "converted", "float32")
    back = load_converted(out)
    ids, mask = left_padded(3, 2, 6, (0, 2))
    np.testing.assert_array_equal(np.asarray(back(jnp.asarray(ids), jnp.asarray(mask))),
                                  np.asarray(model(jnp.asarray(ids), jnp.asarray(mask))))
    save_pretrained(model, tmp_path / "export")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", attn_implementation="eager")
    assert type(exported) is transformers.GemmaForCausalLM
    np.testing.assert_array_equal(hf_logits(exported.eval(), ids, mask), hf_logits(hf, ids, mask))

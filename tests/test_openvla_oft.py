"""OpenVLA-OFT parallel decoding, the value head and backbone LoRA.

The OFT reference is the torch OpenVLA of ``tests/openvla_torch.py`` run on the same
multimodal sequence plus the action slots, with an explicit 4-D attention mask (prompt
causal, slots see the prompt and each other) handed to transformers' Llama; the slot
embeddings are random (OFT starts them at zero, which would hide a wrong slot order).
Left-padded prompts are compared row by row against the unpadded row in torch. The L1
regression head is checked against a torch MLP-ResNet holding our weights, Gaussian
log-probs against the hand formula, the value head against a numpy MLP.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from flax import nnx

from rlinf_jax.errors import BadInput
from rlinf_jax.policies.convert import openvla as convert_openvla
from rlinf_jax.policies.vla import oft
from rlinf_jax.policies.vla.heads import BackboneLoRA, ValueHead
from tests.openvla_torch import ACTION_DIM, BINS, IMAGE, VOCAB_END, write_standin

torch.set_num_threads(1)
TOL = 1e-4
CHUNK = 2
SLOTS = CHUNK * ACTION_DIM
PADS, T = (0, 3, 1), 9


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    path = tmp_path_factory.mktemp("openvla")
    ref = write_standin(path, seed=1)
    return ref, path


def make_policy(path, head, seed):
    vla = convert_openvla.from_pretrained(path)
    policy = oft.OFTPolicy(vla, oft.OFTConfig(chunk=CHUNK, action_dim=ACTION_DIM, head=head), rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    policy.slot_embed[...] = jnp.asarray(rng.normal(size=policy.slot_embed[...].shape).astype(np.float32))
    if policy.action_head is not None:  # every head parameter random, norms around 1
        for path_, var in nnx.to_flat_state(nnx.state(policy.action_head, nnx.Param)):
            v = rng.normal(size=var.get_value().shape).astype(np.float32) * 0.3
            var.set_value(jnp.asarray(v + (1.0 if path_[-1] == "scale" else 0.0)))
    return policy


@pytest.fixture(scope="module")
def discrete(standin):
    return make_policy(standin[1], "discrete", 0)


@pytest.fixture(scope="module")
def continuous(standin):
    return make_policy(standin[1], "continuous", 1)


def prompts(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, 280, (len(PADS), T))
    mask = np.ones((len(PADS), T), np.int64)
    for row, n in enumerate(PADS):
        ids[row, :n], mask[row, :n] = 0, 0
        ids[row, n] = 1
    pixels = rng.normal(size=(len(PADS), 6, IMAGE, IMAGE)).astype(np.float32)
    return ids, mask, pixels


@nnx.jit
def run(policy, ids, mask, pixels, actions, key, temperature):
    return (
        oft.forward_chunk(policy, ids, mask, pixels, actions, temperature),
        oft.sample_chunk(policy, ids, mask, pixels, key, temperature),
        policy.slot_states(ids, mask, pixels),
        policy.vla.hidden_states(ids, mask, pixels)[:, -1],
    )


def torch_slots(ref, pixels, ids, slot_embed):
    """One unpadded row through the torch OpenVLA with action slots: (slot logits, slot
    hidden states, last prompt hidden state)."""
    S = slot_embed.shape[0]
    with torch.no_grad():
        emb = ref.llm.get_input_embeddings()(torch.tensor(ids))
        mm = torch.cat([emb[:, :1], ref.projected(torch.tensor(pixels)), emb[:, 1:], torch.tensor(slot_embed)[None]], 1)
        L = mm.shape[1]
        P = L - S
        q, k = torch.arange(L)[:, None], torch.arange(L)[None, :]
        allowed = (k <= q) | (q >= P)
        mask = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]
        pos = torch.arange(L)[None]
        hidden = ref.llm.model(inputs_embeds=mm, attention_mask=mask, position_ids=pos).last_hidden_state
        logits = ref.llm.lm_head(hidden)
    return logits[0, P:].numpy(), hidden[0, P:].numpy(), hidden[0, P - 1].numpy()


def restricted_logprobs(logits, ids):
    lo = VOCAB_END - BINS
    sl = torch.log_softmax(torch.tensor(logits[..., lo:VOCAB_END]), dim=-1).numpy()
    return np.take_along_axis(sl, (ids - lo)[..., None], axis=-1)[..., 0]


def nhwc(x):
    return jnp.asarray(x.transpose(0, 2, 3, 1))


def test_discrete_chunk_matches_torch_with_slot_mask(standin, discrete):
    ref, _path = standin
    ids, mask, pixels = prompts(0)
    actions = np.random.default_rng(1).integers(VOCAB_END - BINS, VOCAB_END, (len(PADS), SLOTS))
    fwd, sample, _slots, causal_last = run(
        discrete, jnp.asarray(ids), jnp.asarray(mask), nhwc(pixels), jnp.asarray(actions), jax.random.key(0), 0.0
    )
    slot_embed = np.asarray(discrete.slot_embed[...])
    lp_errs, greedy = [], []
    for row, n in enumerate(PADS):
        logits, _hidden, last = torch_slots(ref, pixels[row : row + 1], ids[row : row + 1, n:], slot_embed)
        lp_errs.append(np.abs(np.asarray(fwd.logprobs[row]) - restricted_logprobs(logits, actions[row])).max())
        lo = VOCAB_END - BINS
        greedy.append(lo + np.argmax(logits[:, lo:VOCAB_END], axis=-1))
        # The prompt never sees the slots: its last state is OpenVLA's causal one.
        np.testing.assert_allclose(np.asarray(fwd.value_hidden[row]), last, atol=TOL)
    assert max(lp_errs) <= TOL, lp_errs
    np.testing.assert_allclose(np.asarray(fwd.chunk_logprob), np.asarray(fwd.logprobs).sum(-1), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fwd.value_hidden), np.asarray(causal_last), atol=1e-5)
    # Greedy parallel decoding: every slot's argmax among the action ids, in one pass.
    np.testing.assert_array_equal(np.asarray(sample.tokens), np.stack(greedy))
    assert sample.actions.shape == (len(PADS), CHUNK, ACTION_DIM)
    tok = discrete.vla.config.tokenizer
    np.testing.assert_allclose(np.asarray(sample.actions).reshape(3, -1), np.asarray(tok.decode(sample.tokens)))


def test_discrete_sampled_chunk_reports_its_logprobs(discrete):
    ids, mask, pixels = prompts(2)
    args = (jnp.asarray(ids), jnp.asarray(mask), nhwc(pixels))
    dummy = jnp.full((len(PADS), SLOTS), VOCAB_END - 1)
    _, sample, _, _ = run(discrete, *args, dummy, jax.random.key(3), 1.5)
    fwd, _, _, _ = run(discrete, *args, sample.tokens, jax.random.key(3), 1.5)
    np.testing.assert_allclose(np.asarray(sample.logprobs), np.asarray(fwd.logprobs), atol=1e-5)
    assert len(np.unique(np.asarray(sample.tokens))) > 3  # sampled, not collapsed


class TorchMLPResNet(torch.nn.Module):
    """OFT's L1 regression head in torch, loaded with our parameters."""

    def __init__(self, head):
        super().__init__()

        def ln(m):
            n = torch.nn.LayerNorm(m.scale[...].shape[0], eps=1e-5)
            n.weight.data = torch.tensor(np.asarray(m.scale[...]))
            n.bias.data = torch.tensor(np.asarray(m.bias[...]))
            return n

        def lin(m):
            w = np.asarray(m.kernel[...])
            n = torch.nn.Linear(*w.shape)
            n.weight.data = torch.tensor(w.T.copy())
            n.bias.data = torch.tensor(np.asarray(m.bias[...]))
            return n

        self.norm_in, self.fc1 = ln(head.norm_in), lin(head.fc1)
        self.blocks = torch.nn.ModuleList(
            [torch.nn.Sequential(ln(n), lin(f), torch.nn.ReLU()) for n, f in zip(head.block_norms, head.block_fcs)]
        )
        self.norm_out, self.fc2 = ln(head.norm_out), lin(head.fc2)

    def forward(self, x):
        x = torch.relu(self.fc1(self.norm_in(x)))
        for block in self.blocks:
            x = x + block(x)
        return self.fc2(self.norm_out(x))


def test_continuous_head_matches_torch(standin, continuous):
    ref, _path = standin
    ids, mask, pixels = prompts(4)
    target = np.random.default_rng(5).uniform(-1, 1, (len(PADS), CHUNK, ACTION_DIM)).astype(np.float32)
    fwd, sample, slots, _ = run(
        continuous, jnp.asarray(ids), jnp.asarray(mask), nhwc(pixels), jnp.asarray(target), jax.random.key(0), 0.0
    )
    head = TorchMLPResNet(continuous.action_head)
    slot_embed = np.asarray(continuous.slot_embed[...])
    means = []
    for row, n in enumerate(PADS):
        _logits, hidden, _last = torch_slots(ref, pixels[row : row + 1], ids[row : row + 1, n:], slot_embed)
        np.testing.assert_allclose(np.asarray(slots.slots[row]), hidden, atol=TOL)
        with torch.no_grad():
            means.append(head(torch.tensor(hidden.reshape(CHUNK, -1))).numpy())
    means = np.stack(means)
    assert np.abs(np.asarray(fwd.prediction) - means).max() <= TOL
    np.testing.assert_allclose(np.asarray(sample.actions), means, atol=TOL)  # greedy = the mean
    log_std = np.asarray(continuous.log_std[...])
    z = (target - means) / np.exp(log_std)
    expected = (-0.5 * z**2 - log_std - 0.5 * np.log(2 * np.pi)).reshape(3, -1)
    np.testing.assert_allclose(np.asarray(fwd.logprobs), expected, atol=1e-3)
    loss = nnx.jit(oft.l1_loss)(continuous, jnp.asarray(ids), jnp.asarray(mask), nhwc(pixels), jnp.asarray(target))
    np.testing.assert_allclose(float(loss), np.abs(means - target).mean(), atol=TOL)


def test_value_head_matches_numpy_mlp():
    head = ValueHead(12, (8, 5), rngs=nnx.Rngs(0))
    x = np.random.default_rng(0).normal(size=(4, 12)).astype(np.float32)
    assert np.all(np.asarray(head(jnp.asarray(x))) == 0.0)  # a fresh critic predicts 0
    rng = np.random.default_rng(1)
    for p in (*head.kernels, *head.biases):
        p[...] = jnp.asarray(rng.normal(size=p[...].shape).astype(np.float32))
    h = x
    for i, (w, b) in enumerate(zip(head.kernels, head.biases)):
        h = h @ np.asarray(w[...]) + np.asarray(b[...])
        if i < 2:
            h = torch.nn.functional.gelu(torch.tensor(h)).numpy()
    np.testing.assert_allclose(np.asarray(head(jnp.asarray(x))), h[:, 0], atol=1e-5)


def test_backbone_lora_adapts_only_the_chosen_modules(standin):
    vla = convert_openvla.from_pretrained(standin[1])
    state = nnx.state(vla, nnx.Param)
    lora = BackboneLoRA(state, rank=2, alpha=4.0, prefixes=("llm", "projector"))
    assert lora.targets and all(t.startswith(("llm:", "projector:")) for t in lora.targets)
    assert any(t.startswith("projector:fc3") for t in lora.targets)
    assert not any("featurizers" in t for t in lora.targets)
    adapters = lora.init(jax.random.key(0))
    key = "llm:layers:0:attn:q_proj:kernel"
    adapters[key]["b"] = jnp.ones_like(adapters[key]["b"])
    merged = nnx.to_flat_state(lora.merge(state, adapters))
    before = {p: v.get_value() for p, v in nnx.to_flat_state(state)}
    for path, var in merged:
        name = ":".join(str(p) for p in path)
        if name == key:
            a = np.asarray(adapters[key]["a"])
            w = np.asarray(before[path])
            expected = w + 2.0 * a @ np.ones((2, w.shape[1]), np.float32)
            np.testing.assert_allclose(np.asarray(var.get_value()), expected, atol=1e-5)
        else:  # B = 0 everywhere else: unchanged
            np.testing.assert_array_equal(np.asarray(var.get_value()), np.asarray(before[path]))
    with pytest.raises(BadInput, match="no kernels"):
        BackboneLoRA(state, 2, 4.0, prefixes=("nowhere",))

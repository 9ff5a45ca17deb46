"""Partition rules: logical axis names -> per-component shardings.

Spec logic is checked on abstract meshes (no devices needed); placement of a real model
runs on 8 fake CPU devices (the `devices` marker).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from rlinf_jax.errors import BadInput
from rlinf_jax.sharding.mesh import replicated
from rlinf_jax.sharding.partition import (
    DEFAULT_RULES,
    default_spec,
    init_sharded,
    logical_axes,
    logical_to_spec,
    param_shardings,
    rules_from_config,
    shard_params,
)
from rlinf_jax.sharding.placement import component_mesh, resolve_placement

FT = AbstractMesh((2, 2), ("fsdp", "tensor"))
T4 = AbstractMesh((4,), ("tensor",))
DFT = AbstractMesh((2, 2, 2), ("data", "fsdp", "tensor"))


def test_logical_names_map_to_mesh_axes():
    assert logical_to_spec(("embed", "mlp"), FT) == P("fsdp", "tensor")
    assert logical_to_spec(("mlp", "embed"), FT) == P("tensor", "fsdp")
    # head_dim has no mesh axis; trailing whole dims are left out of the spec.
    assert logical_to_spec(("q_heads", "head_dim", "embed"), FT) == P("tensor", None, "fsdp")
    assert logical_to_spec(("embed", "q_heads", "head_dim"), FT) == P("fsdp", "tensor")
    assert logical_to_spec(("norm",), FT) == P()
    # batch spans data and fsdp where both exist; axes a mesh lacks are dropped.
    assert logical_to_spec(("batch", None), DFT) == P(("data", "fsdp"))
    assert logical_to_spec(("batch",), FT) == P("fsdp")
    assert logical_to_spec(("embed", "mlp"), T4) == P(None, "tensor")


def test_size_one_axes_are_dropped():
    mesh = AbstractMesh((1, 4, 1), ("data", "fsdp", "tensor"))
    assert logical_to_spec(("embed", "mlp"), mesh) == P("fsdp")
    assert logical_to_spec(("batch",), mesh) == P("fsdp")


def test_a_mesh_axis_is_used_once_per_spec():
    # Both dims map to tensor: the first one takes it.
    assert logical_to_spec(("mlp", "vocab"), T4) == P("tensor")
    # embed wants fsdp, which batch already took.
    assert logical_to_spec(("batch", "embed"), DFT) == P(("data", "fsdp"))


def test_non_divisible_dims_replicate_per_dim():
    # 2 KV heads cannot split 4 ways; the rest of the spec still shards.
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), T4, shape=(16, 2, 8)) == P()
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), FT, shape=(16, 2, 8)) == P("fsdp", "tensor")
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), FT, shape=(15, 2, 8)) == P(None, "tensor")
    # A dim left whole frees its axis for a later dim.
    assert logical_to_spec(("mlp", "vocab"), T4, shape=(3, 32)) == P(None, "tensor")
    # batch=6 on data*fsdp=4 does not divide: whole.
    assert logical_to_spec(("batch",), DFT, shape=(6,)) == P()
    assert logical_to_spec(("batch",), DFT, shape=(12,)) == P(("data", "fsdp"))


def test_several_names_on_one_dim_and_custom_rules():
    assert logical_to_spec((("q_heads", "head_dim"),), FT, rules={**DEFAULT_RULES, "head_dim": "fsdp"}) == P(
        ("tensor", "fsdp")
    )
    assert logical_to_spec(("embed", "mlp"), FT, rules={**DEFAULT_RULES, "embed": None, "mlp": "fsdp"}) == P(None, "fsdp")


def test_unknown_logical_name_is_bad_input():
    with pytest.raises(BadInput, match=r"unknown logical axis 'heads'.*batch, embed, head_dim"):
        logical_to_spec(("embed", "heads"), FT)
    with pytest.raises(BadInput, match="3 dimensions but the array has shape"):
        logical_to_spec(("embed", "mlp", "norm"), FT, shape=(4, 4))


def test_default_rule_for_unannotated_leaves():
    # 64 x 512 = 32768 elements >= 2**14: split over fsdp*tensor=4 along the larger dim.
    assert default_spec((64, 512), FT) == P(None, ("fsdp", "tensor"))
    assert default_spec((512, 64), FT) == P(("fsdp", "tensor"))
    # Largest dim (1026) is not divisible by 4, so the next largest divisible one (32) is taken.
    assert default_spec((32, 1026), FT) == P(("fsdp", "tensor"))
    # Tie: the first dim.
    assert default_spec((256, 256), FT) == P(("fsdp", "tensor"))
    assert default_spec((256, 256), T4) == P("tensor")
    # Nothing divisible, small arrays, scalars: replicated.
    assert default_spec((129, 131), FT) == P()
    assert default_spec((64, 255), FT) == P()
    assert default_spec((), FT) == P()
    assert default_spec((64, 512), FT, min_size=2**16) == P()
    # data never shards parameters.
    assert default_spec((64, 512), AbstractMesh((8,), ("data",))) == P()
    assert default_spec((64, 512), DFT) == P(None, ("fsdp", "tensor"))


def test_param_shardings_on_a_plain_tree_of_abstract_leaves():
    tree = {
        "w": jax.ShapeDtypeStruct((128, 256), np.float32),
        "b": np.zeros((256,), np.float32),
        "step": 3,
    }
    sh = param_shardings(tree, FT)
    assert sh["w"].spec == P(None, ("fsdp", "tensor"))
    assert sh["b"].spec == P() and sh["step"].spec == P()
    assert sh["w"].mesh == FT


def test_param_shardings_names_the_leaf_with_a_bad_annotation():
    from flax import nnx

    from rlinf_jax.sharding.partition import logical_axes

    class Bad(nnx.Module):
        def __init__(self):
            self.w = nnx.Param(logical_axes(nnx.initializers.ones_init(), ("embed", "experts"))(jax.random.key(0), (4, 4)))

    with pytest.raises(BadInput, match=r"parameter .*\['w'\].*unknown logical axis 'experts'"):
        param_shardings(Bad(), FT)


def test_rules_from_config():
    assert rules_from_config(None) == dict(DEFAULT_RULES)
    rules = rules_from_config({"embed": None, "mlp": ["fsdp", "tensor"], "experts": "fsdp", "vocab": ["tensor"]})
    assert rules["embed"] is None and rules["mlp"] == ("fsdp", "tensor")
    assert rules["experts"] == "fsdp" and rules["vocab"] == "tensor"
    assert rules["batch"] == ("data", "fsdp")  # untouched defaults stay
    assert DEFAULT_RULES["embed"] == "fsdp"  # defaults are not mutated
    assert logical_to_spec(("experts", "mlp"), DFT, rules) == P("fsdp", "tensor")
    with pytest.raises(BadInput, match=r"embed maps to unknown mesh axis 'model'; axes are data, fsdp, tensor"):
        rules_from_config({"embed": "model"})
    with pytest.raises(BadInput, match="unknown mesh axis 'expert'"):
        rules_from_config({"mlp": ["tensor", "expert"]})
    with pytest.raises(BadInput, match="twice"):
        rules_from_config({"mlp": ["tensor", "tensor"]})
    with pytest.raises(BadInput, match="must be a mapping"):
        rules_from_config(["embed"])


# ------------------------------------------------ a real model on component meshes
init = nnx.initializers.normal(0.5)


class Block(nnx.Module):
    # Attention- and MLP-shaped parameters: vocab 32, embed 16, 4 query heads, 2 KV heads, head_dim 8, mlp 64.
    def __init__(self, rngs):
        self.embed = nnx.Embed(32, 16, embedding_init=logical_axes(init, ("vocab", "embed")), rngs=rngs)
        self.q = nnx.LinearGeneral(16, (4, 8), use_bias=False, kernel_init=logical_axes(init, ("embed", "q_heads", "head_dim")), rngs=rngs)
        self.k = nnx.LinearGeneral(16, (2, 8), use_bias=False, kernel_init=logical_axes(init, ("embed", "kv_heads", "head_dim")), rngs=rngs)
        self.o = nnx.LinearGeneral((4, 8), 16, axis=(-2, -1), use_bias=False, kernel_init=logical_axes(init, ("q_heads", "head_dim", "embed")), rngs=rngs)
        self.up = nnx.Linear(16, 64, kernel_init=logical_axes(init, ("embed", "mlp")), bias_init=logical_axes(init, ("mlp",)), rngs=rngs)
        self.down = nnx.Linear(64, 16, kernel_init=logical_axes(init, ("mlp", "embed")), rngs=rngs)
        self.norm = nnx.RMSNorm(16, scale_init=logical_axes(nnx.initializers.ones_init(), ("norm",)), rngs=rngs)
        # No annotations: the default rule decides (64*256 = 2**14 elements is just big enough).
        self.head = nnx.Linear(64, 256, bias_init=init, rngs=rngs)

    def __call__(self, tokens):
        x = self.norm(self.embed(tokens))
        q, k = self.q(x), self.k(x)
        k = jnp.repeat(k, 2, axis=-2)
        att = jax.nn.softmax(jnp.einsum("bthd,bshd->bhts", q, k) / 8**0.5, axis=-1)
        x = x + self.o(jnp.einsum("bhts,bshd->bthd", att, q))
        h = self.up(x)
        return x + self.down(jax.nn.gelu(h)), self.head(h)


def flat(tree):
    out = {}
    for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]:
        # Dict keys only: a Variable adds a ``.value`` step to the path.
        out[".".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))] = v
    return out


@pytest.mark.slow
@pytest.mark.devices(8)
def test_model_on_component_meshes():
    assert len(jax.devices()) == 8
    pl = resolve_placement({"actor": "0-3", "rollout": "4-7", "env": "all"}, ("actor", "rollout", "env"), 8,
                           {"actor": {"fsdp": 2, "tensor": 2}, "rollout": {"tensor": 4}})
    actor, rollout, data = (component_mesh(pl, n) for n in ("actor", "rollout", "env"))
    assert dict(data.shape) == {"data": 8}

    model = Block(nnx.Rngs(0))
    state = nnx.state(model)
    ft = ("fsdp", "tensor")
    expected = {
        "actor": {
            "embed.embedding": P("tensor", "fsdp"), "q.kernel": P("fsdp", "tensor"), "k.kernel": P("fsdp", "tensor"),
            "o.kernel": P("tensor", None, "fsdp"), "up.kernel": P("fsdp", "tensor"), "up.bias": P("tensor"),
            "down.kernel": P("tensor", "fsdp"), "down.bias": P(), "norm.scale": P(),
            "head.kernel": P(None, ft), "head.bias": P(),
        },
        "rollout": {
            # kv_heads=2 does not split over tensor=4: the K projection is replicated.
            "embed.embedding": P("tensor"), "q.kernel": P(None, "tensor"), "k.kernel": P(),
            "o.kernel": P("tensor"), "up.kernel": P(None, "tensor"), "up.bias": P("tensor"),
            "down.kernel": P("tensor"), "down.bias": P(), "norm.scale": P(),
            "head.kernel": P(None, "tensor"), "head.bias": P(),
        },
        "env": {k: P() for k in ("embed.embedding", "q.kernel", "k.kernel", "o.kernel", "up.kernel", "up.bias",
                                 "down.kernel", "down.bias", "norm.scale", "head.kernel", "head.bias")},
    }
    meshes = {"actor": actor, "rollout": rollout, "env": data}


    for name, mesh in meshes.items():
        got = flat(param_shardings(state, mesh))
        assert set(got) == set(expected[name]), (name, sorted(got))
        for key, spec in expected[name].items():
            assert got[key].spec == spec, (name, key, got[key].spec, spec)
            assert got[key].mesh == mesh
        # The abstract model lays out exactly like the concrete one, and a module is accepted too.
        abstract = nnx.state(nnx.eval_shape(lambda: Block(nnx.Rngs(0))))
        assert flat(param_shardings(abstract, mesh)) == got
        assert flat(param_shardings(model, mesh)) == got
    # Replicated on the data mesh means the same sharding the trainer's `replicate` uses.
    assert all(s == replicated(data) for s in flat(param_shardings(state, data)).values())
    # Actor (FSDP x tensor) and rollout (tensor only) really differ.
    a, r = flat(param_shardings(state, actor)), flat(param_shardings(state, rollout))
    assert a["q.kernel"].spec != r["q.kernel"].spec and a["k.kernel"].spec != r["k.kernel"].spec

    # Placing: exact values, each shard the hand-computed slice shape on the component's devices.
    shard_shapes = {
        "actor": {"q.kernel": (8, 2, 8), "k.kernel": (8, 1, 8), "o.kernel": (2, 8, 8), "embed.embedding": (16, 8),
                  "head.kernel": (64, 64), "head.bias": (256,), "up.bias": (32,)},
        "rollout": {"q.kernel": (16, 1, 8), "k.kernel": (16, 2, 8), "o.kernel": (1, 8, 16), "embed.embedding": (8, 16),
                    "head.kernel": (64, 64), "head.bias": (256,), "up.bias": (16,)},
        "env": {"q.kernel": (16, 4, 8), "head.kernel": (64, 256)},
    }
    ref = flat(state)
    tokens = jnp.arange(12).reshape(2, 6) % 32
    want = jax.jit(lambda m, t: m(t))(model, tokens)
    for name, mesh in meshes.items():
        placed = shard_params(state, mesh)
        got = flat(placed)
        for key, x in got.items():
            np.testing.assert_array_equal(np.asarray(x), np.asarray(ref[key]))
            assert x.sharding.device_set == set(mesh.devices.flat), (name, key)
        for key, shp in shard_shapes[name].items():
            shards = got[key].addressable_shards
            assert len(shards) == mesh.size and all(s.data.shape == shp for s in shards), (name, key, [s.data.shape for s in shards])
        # Each shard holds the matching slice of the original.
        for s in got["q.kernel"].addressable_shards:
            np.testing.assert_array_equal(np.asarray(s.data), np.asarray(ref["q.kernel"])[s.index])
        # The sharded module computes what the unsharded one does.
        sharded_model = shard_params(model, mesh)
        out = jax.jit(lambda m, t: m(t))(sharded_model, tokens)
        for o, w in zip(out, want):
            np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-5, atol=1e-5)

    # Initialised directly sharded: same values as a plain init, already on the actor's layout.
    direct = init_sharded(lambda: Block(nnx.Rngs(0)), actor)
    got = flat(nnx.state(direct))
    for key, spec in expected["actor"].items():
        assert got[key].sharding.spec == spec, (key, got[key].sharding.spec)
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(ref[key]))

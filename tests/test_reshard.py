"""Weight sync across component meshes on 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rlinf_jax.sharding.placement import component_mesh, resolve_placement
from rlinf_jax.sharding.reshard import reshard, sync_weights


@pytest.mark.devices(8)
def test_weight_sync_across_meshes():
    devices = jax.devices()
    assert len(devices) == 8
    pl = resolve_placement({"env": "0-3", "rollout": "4-7", "actor": "0-7"}, ("env", "rollout", "actor"), 8,
                           {"actor": {"data": 2, "fsdp": 4}})
    actor, rollout = component_mesh(pl, "actor"), component_mesh(pl, "rollout")
    params = {"w": jnp.arange(64.0).reshape(8, 8), "lora": jnp.ones((8, 2)), "b": jnp.arange(8.0)}
    on_actor = reshard(params, {"w": NamedSharding(actor, P("fsdp", None)), "lora": NamedSharding(actor, P()),
                                "b": NamedSharding(actor, P("data"))})
    rollout_sh = NamedSharding(rollout, P(None, "data"))
    on_rollout = reshard(on_actor, {"w": rollout_sh, "lora": NamedSharding(rollout, P()), "b": NamedSharding(rollout, P("data"))})
    for k in params:
        np.testing.assert_array_equal(np.asarray(on_rollout[k]), np.asarray(params[k]))
        assert on_rollout[k].sharding.device_set == set(devices[4:8]), k
        assert on_actor[k].sharding.device_set == set(devices), k

    # Same shardings: nothing is copied.
    same = reshard(on_rollout, jax.tree.map(lambda x: x.sharding, on_rollout))
    assert all(a is b for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(on_rollout)))

    # Trainable subset only: LoRA moves, the frozen weight keeps the destination's arrays.
    updated = {**on_actor, "lora": on_actor["lora"] * 3.0, "w": on_actor["w"] + 1.0}
    synced = sync_weights(updated, on_rollout, only=lambda path, x: "lora" in jax.tree_util.keystr(path))
    assert synced["w"] is on_rollout["w"]
    np.testing.assert_array_equal(np.asarray(synced["lora"]), 3.0)
    assert synced["lora"].sharding == on_rollout["lora"].sharding

    # Donation: the source buffer is consumed by a one-way hand-off.
    src = reshard(jnp.arange(16.0), NamedSharding(actor, P(("data", "fsdp"))))
    moved = reshard(src, rollout_sh.update(spec=P("data")), donate=True)
    np.testing.assert_array_equal(np.asarray(moved), np.arange(16.0))
    assert src.is_deleted()


@pytest.mark.devices(8)
@pytest.mark.parametrize("spec", [P("fsdp"), P(None, "fsdp"), P()])
def test_a_state_moves_onto_a_phase_mesh_and_back_device_to_device(monkeypatch, spec):
    # cluster.scaling=dynamic's moves: the actor's {fsdp: 4} on devices 4-7 onto all 8
    # ({fsdp: 8}) and back. jax.device_put alone would gather a leaf whose pieces change on
    # the host (ArrayImpl._value); here no leaf may.
    from jax._src.array import ArrayImpl

    devices = jax.devices()
    home = jax.sharding.Mesh(np.array(devices[4:]), ("fsdp",))
    phase = jax.sharding.Mesh(np.array(devices), ("fsdp",))
    value = np.arange(256.0).reshape(16, 16)
    x = jax.device_put(value, NamedSharding(home, spec))
    with monkeypatch.context() as m:
        m.setattr(ArrayImpl, "_value", property(lambda self: pytest.fail("a leaf went through the host")))
        there = reshard({"x": x}, NamedSharding(phase, spec), donate=True)["x"]
        back = reshard({"x": there}, NamedSharding(home, spec), donate=True)["x"]
        back.block_until_ready()
    assert there.sharding.device_set == set(devices) and back.sharding == NamedSharding(home, spec)
    # Each source is freed once its copy landed, or lives on in the new layout where that
    # keeps its pieces as they are (replicated: the actor's devices copy nothing).
    for source, moved in ((x, there), (there, back)):
        kept = lambda a: {s.data.unsafe_buffer_pointer() for s in a.addressable_shards}  # noqa: E731
        assert source.is_deleted() or kept(source) & kept(moved)
    np.testing.assert_array_equal(np.asarray(back), value)

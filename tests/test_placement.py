"""Placement parsing, mode derivation, presets, mesh shapes and every error case."""

import json

import jax
import pytest

from rlinf_jax.errors import BadInput
from rlinf_jax.sharding.placement import component_mesh, parse_ranks, preset, resolve_placement

EMBODIED = ("env", "rollout", "actor")


@pytest.mark.parametrize(
    "spec, expected",
    [("all", (0, 1, 2, 3, 4, 5, 6, 7)), ("3", (3,)), ("0-3", (0, 1, 2, 3)), ("0,2,5", (0, 2, 5)), ("0-3,6", (0, 1, 2, 3, 6)), (5, (5,))],
)
def test_parse_ranks(spec, expected):
    assert parse_ranks(spec, 8) == expected


@pytest.mark.parametrize("spec, fragment", [("8", "out of range"), ("0-9", "out of range"), ("a-b", "cannot read"), ("3-1", "cannot read"), ("", "cannot read")])
def test_parse_ranks_errors(spec, fragment):
    with pytest.raises(BadInput, match=fragment):
        parse_ranks(spec, 8)


@pytest.mark.parametrize(
    "spec, mode",
    [
        ({"actor,rollout,env": "all"}, "collocated"),
        ({"env": "0-1", "rollout": "2-3", "actor": "4-7"}, "disaggregated"),
        ({"env": "0-3", "rollout": "4-7", "actor": "0-7"}, "hybrid"),
        ({"env": "0-3", "rollout": "0-3", "actor": "3-7"}, "hybrid"),
        # Components sharing one set form a collocated group; disjoint groups: disaggregated.
        ({"env,rollout": "0-3", "actor": "4-7"}, "disaggregated"),
    ],
)
def test_mode_follows_from_the_sets(spec, mode):
    assert resolve_placement(spec, EMBODIED, 8).mode == mode


@pytest.mark.parametrize("name", ["collocated", "disaggregated", "hybrid"])
def test_presets_give_their_mode(name):
    p = resolve_placement(name, EMBODIED, 8)
    assert p.mode == name
    used = set().union(*(c.devices for c in p.components.values()))
    assert used == set(range(8))


def test_hybrid_preset_shares_the_learner():
    assert preset("hybrid", EMBODIED, 8) == {"env": "0-3", "rollout": "4-7", "actor": "0-7"}
    assert preset("disaggregated", EMBODIED, 8) == {"env": "0-1", "rollout": "2-3", "actor": "4-7"}
    # Too few devices for three disjoint sets: env and rollout share the non-learner half.
    assert preset("disaggregated", EMBODIED, 2) == {"env,rollout": "0", "actor": "1"}
    assert preset("hybrid", EMBODIED, 2) == {"env": "0", "rollout": "1", "actor": "0-1"}


@pytest.mark.parametrize(
    "spec, meshes, fragment",
    [
        ({"env,rollout,actor,critic": "all"}, None, "unknown component 'critic'"),
        ({"env,rollout": "all"}, None, "no devices for actor"),
        ({"env,rollout": "all", "env,actor": "all"}, None, "placed twice"),
        ({"env,rollout,actor": "0-8"}, None, "out of range"),
        ({"env,rollout,actor": "all"}, {"actor": {"data": 3}}, "make the axis sizes multiply to 8"),
        ({"env,rollout,actor": "all"}, {"actor": {"batch": 8}}, "unknown axis 'batch'"),
        ({"env,rollout,actor": "all"}, {"reward": {"data": 8}}, "unknown component 'reward'"),
        ("sideways", None, "not a preset"),
        ("disaggregated", None, "3 component(s) to split over 1"),
    ],
)
def test_invalid_placements_are_bad_input(spec, meshes, fragment):
    n = 1 if spec == "disaggregated" else 8
    with pytest.raises(BadInput) as e:
        resolve_placement(spec, EMBODIED, n, meshes)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_mesh_shapes_and_json(tmp_path):
    p = resolve_placement({"env": "0-3", "rollout": "4-7", "actor": "0-7"}, EMBODIED, 8, {"actor": {"data": 2, "fsdp": 4}})
    assert p.components["actor"].axis_names == ("data", "fsdp")
    assert p.components["env"].mesh_shape == {"data": 4}
    p.write(tmp_path / "placement.json")
    saved = json.loads((tmp_path / "placement.json").read_text())
    assert saved["mode"] == "hybrid"
    assert saved["components"]["rollout"] == {"devices": [4, 5, 6, 7], "mesh_shape": {"data": 4}, "axis_names": ["data"]}


def test_component_mesh_uses_the_placed_devices():
    devices = jax.devices()
    p = resolve_placement({"env,rollout,actor": "0"}, EMBODIED, len(devices))
    mesh = component_mesh(p, "actor", devices)
    assert mesh.axis_names == ("data",) and mesh.devices.shape == (1,) and mesh.devices[0] == devices[0]

"""Placement parsing, mode derivation, presets, mesh shapes and every error case."""

import json

import jax
import pytest

from rlinf_jax.config import load_config
from rlinf_jax.errors import BadInput
from rlinf_jax.sharding.placement import component_mesh, grown_shape, parse_ranks, preset, resolve_placement, with_phase

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


@pytest.mark.parametrize("shape, n, grown", [
    ({"data": 4}, 8, {"data": 8}),
    ({"fsdp": 4}, 8, {"fsdp": 8}),  # the state stays split: no chip holds more than before
    ({"data": 2, "fsdp": 2}, 8, {"data": 2, "fsdp": 4}),
    ({"tensor": 2}, 8, {"data": 4, "tensor": 2}),  # a data axis added in front
    ({"data": 4}, 6, {"data": 6}),
    ({"data": 1, "fsdp": 2}, 6, {"data": 1, "fsdp": 6}),
    ({"data": 4}, 4, {"data": 4}),
])
def test_a_mesh_grows_over_more_devices_on_the_axis_it_splits_its_state_over(shape, n, grown):
    assert grown_shape(shape, n, "x") == grown


def test_a_mesh_that_cannot_grow_is_one_error_line():
    with pytest.raises(BadInput, match="cannot stretch over 6 devices"):
        grown_shape({"tensor": 4}, 6, "cluster.scaling=dynamic")


def test_a_phase_lends_the_idle_components_devices_and_placement_json_records_it(tmp_path):
    p = resolve_placement("disaggregated", EMBODIED, 8, {"actor": {"fsdp": "all"}})
    dyn = with_phase(p, "update", "actor", ("rollout",))
    assert dyn.components == p.components and dyn.scaling == "dynamic" and p.scaling == "static"
    assert dyn.phases["update"].devices == (2, 3, 4, 5, 6, 7) and dyn.phases["update"].mesh_shape == {"fsdp": 6}
    dyn.write(tmp_path / "placement.json")
    saved = json.loads((tmp_path / "placement.json").read_text())
    assert saved["scaling"] == "dynamic"
    assert saved["phases"] == {"update": {"devices": [2, 3, 4, 5, 6, 7], "mesh_shape": {"fsdp": 6}, "axis_names": ["fsdp"]}}
    # Where the actor already spans the rollout's devices there is nothing to lend.
    hybrid = resolve_placement("hybrid", EMBODIED, 8)
    with pytest.raises(BadInput, match="already runs on all of them"):
        with_phase(hybrid, "update", "actor", ("rollout",))


def test_component_mesh_uses_the_placed_devices():
    devices = jax.devices()
    p = resolve_placement({"env,rollout,actor": "0"}, EMBODIED, len(devices))
    mesh = component_mesh(p, "actor", devices)
    assert mesh.axis_names == ("data",) and mesh.devices.shape == (1,) and mesh.devices[0] == devices[0]


# ------------------------------------------------------- every preset with every flow
def _embodied(recipe, overrides):
    from rlinf_jax.tasks.embodied.build import build_trainer

    return build_trainer(load_config(recipe, overrides))


def _reasoning(overrides):
    from rlinf_jax.tasks.reasoning.trainer import ReasoningTrainer

    return ReasoningTrainer(load_config("grpo_math", overrides))


def _sft_lm(overrides):
    from rlinf_jax.tasks.sft.lm import SFTTrainer

    return SFTTrainer(load_config("sft_math", overrides))


def _sft_vla(overrides):
    from rlinf_jax.tasks.sft import vla

    return vla.build(load_config("sft_vla_tabletop", overrides))


def _flows():
    from tests.conftest import TINY
    from tests.test_sft import TINY_LM
    from tests.test_vla_flow import TINY_VLA, TINY_VLA_MODEL

    rl = [*TINY_LM, "sft.warm_start_steps=0", "data.rollout_batch_size=4", "algorithm.lm.group_size=4",
          "actor.global_batch_size=16", "actor.micro_batch_size=8"]
    # Runs with a single component (the actor) can only be collocated.
    return {
        "embodied": (lambda o: _embodied("ppo_brax", [*TINY, *o]), True),
        "vla": (lambda o: _embodied("ppo_vla_tabletop", [*TINY_VLA, "env.num_envs=8", "env.num_eval_envs=8",
                                                         "env.reset_mode=cached", *o]), True),
        "reasoning": (lambda o: _reasoning([*rl, *o]), True),
        "reasoning_kl": (lambda o: _reasoning([*rl, "algorithm.lm.kl_coef=0.01", *o]), True),
        "sft": (lambda o: _sft_lm([*TINY_LM, *o]), False),
        "sft_vla": (lambda o: _sft_vla([*TINY_VLA_MODEL, "env.num_envs=8", "env.num_eval_envs=8", *o]), False),
    }


def _presets_on_every_flow(n):
    assert len(jax.devices()) == n
    for flow, (build, splits) in _flows().items():
        for preset_name in ("collocated", "disaggregated", "hybrid"):
            overrides = [f"cluster.component_placement={preset_name}"]
            if flow in ("embodied", "vla") and preset_name == "hybrid":
                overrides.append("flow.num_micro_batches=2")
            if preset_name != "collocated" and not splits:
                with pytest.raises(BadInput, match="collocated") as info:
                    build(overrides)
                assert "\n" not in str(info.value)
                continue
            trainer = build(overrides)
            try:
                placement = trainer.placement.to_json()
            finally:
                trainer.close()
            assert placement["mode"] == preset_name, (flow, placement)
            assert placement["requested"] == preset_name and placement["derived"], (flow, placement)
            used = set().union(*(c["devices"] for c in placement["components"].values()))
            assert used == set(range(n)), (flow, placement)
            if preset_name == "hybrid":
                # The learner spans every device; generation runs on a part of them.
                comps = placement["components"]
                assert comps["actor"]["devices"] == list(range(n)), (flow, comps)
                assert all(len(c["devices"]) < n for k, c in comps.items() if k != "actor"), (flow, comps)


@pytest.mark.slow
@pytest.mark.devices(8)
def test_every_preset_gives_its_layout_on_every_flow_on_8_devices():
    _presets_on_every_flow(8)


@pytest.mark.slow
@pytest.mark.devices(2)
def test_every_preset_gives_its_layout_on_every_flow_on_2_devices():
    _presets_on_every_flow(2)


def test_a_preset_that_cannot_give_its_layout_is_one_error_line():
    with pytest.raises(BadInput, match="can only be placed collocated|over 1 device"):
        resolve_placement("hybrid", ("rollout", "actor"), 1)
    with pytest.raises(BadInput, match="this run has one \\(actor\\)"):
        resolve_placement("disaggregated", ("actor",), 8)
    hybrid = resolve_placement("hybrid", ("rollout", "actor"), 8)
    assert hybrid.mode == "hybrid" and hybrid.derived == {"rollout": "0-3", "actor": "0-7"}
    assert hybrid.to_json()["requested"] == "hybrid"

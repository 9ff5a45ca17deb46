"""Recipe loading: overrides, inheritance, round trips and every bad-input message."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import yaml

from rlinf_jax.config import Config, config_to_yaml, list_recipes, load_config, load_config_file
from rlinf_jax.errors import BadInput
from rlinf_jax.tasks.registry import load_run_config

RECIPES = Path(__file__).resolve().parent.parent / "rlinf_jax" / "configs"


def bad(overrides=(), name="ppo_brax", config_dir=None) -> str:
    with pytest.raises(BadInput) as info:
        load_run_config(name, list(overrides), config_dir=config_dir)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


def write(d: Path, name: str, text: str) -> Path:
    p = d / f"{name}.yaml"
    p.write_text(textwrap.dedent(text))
    return p


# ----------------------------------------------------------------------------- good paths


def _flat(tree, prefix=""):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_default_recipe_values_come_from_its_yaml():
    import yaml

    assert "ppo_brax" in list_recipes()
    cfg = load_config()
    assert isinstance(cfg, Config)
    for path, value in _flat(yaml.safe_load((RECIPES / "ppo_brax.yaml").read_text())):
        got = cfg
        for part in path.split("."):
            got = getattr(got, part)
        if isinstance(value, str) and "${" in value:
            continue  # interpolations are checked resolved below
        assert got == (float(value) if isinstance(got, float) else value), path
    assert cfg.runner.experiment_name == "ppo_brax_inverted_pendulum"


@pytest.mark.parametrize("name", list_recipes())
def test_every_packaged_recipe_loads(name):
    assert isinstance(load_config(name), Config)


def test_default_recipe_spells_out_required_keys():
    text = (RECIPES / "ppo_brax.yaml").read_text()
    for key in ("output_dir: runs", "experiment_name:", "seed:", "max_steps:",
                "save_interval:", "eval_interval:", "resume: none"):
        assert key in text, key


def _recipe_keys(name: str) -> set[str]:
    """Every dotted key a packaged recipe sets, through its base chain."""
    import yaml

    data = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())

    def walk(tree, prefix=""):
        for k, v in tree.items():
            if isinstance(v, dict) and v:
                yield from walk(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"  # a leaf, or an open mapping written as {}

    keys = {path for path in walk(data) if path != "base"}
    if "base" in data:
        keys |= _recipe_keys(data["base"])
    return keys


def _schema_keys(obj, prefix=""):
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            yield from _schema_keys(v, prefix + f.name + ".")
        else:
            yield prefix + f.name


def test_every_schema_key_is_spelled_out_by_a_recipe():
    # Recipes (and the fragments they build on) double as the reference of what can be set:
    # each key appears in at least one.
    names = [p.stem for p in RECIPES.glob("*.yaml")]
    assert any(n.startswith("_") for n in names) and not any(n.startswith("_") for n in list_recipes())
    listed = set().union(*(_recipe_keys(n) for n in names))
    missing = [k for k in _schema_keys(Config()) if k not in listed]
    assert not missing, missing


@pytest.mark.parametrize("recipe, sections", [
    # The default recipe of each workload spells out every key of these sections its task reads.
    ("ppo_brax", ["runner", "env", "algorithm", "cluster", "flow"]),
    ("grpo_math", ["data", "reward", "rollout", "sft", "algorithm"]),
    ("sac_brax", ["runner", "env", "algorithm", "actor", "cluster", "flow"]),
])
def test_default_recipe_of_each_workload_covers_what_its_task_reads(recipe, sections):
    from rlinf_jax.tasks.registry import task_of

    keys = _recipe_keys(recipe)
    cfg = load_config(recipe)
    reads = task_of(cfg).reads(cfg)
    for section in sections:
        for key in _schema_keys(getattr(Config(), section), section + "."):
            if key in reads and key != "runner.task":  # embodied is the default task
                assert key in keys, (recipe, key)


def test_override_types():
    cfg = load_config(overrides=[
        "runner.max_steps=10",                          # int
        "actor.optim.lr=1e-3",                          # float in exponent form
        "algorithm.gamma=1",                            # int into a float field
        "runner.progress_bar=false",                    # bool
        "actor.model.policy_hidden_sizes=[64,64]",      # list
        "env.name=ant",                                 # str
        "cluster.num_devices=2",                        # int into a str field
        "runner.experiment_name=a b",
    ])
    assert cfg.runner.max_steps == 10
    assert cfg.actor.optim.lr == pytest.approx(1e-3)
    assert cfg.algorithm.gamma == 1.0 and isinstance(cfg.algorithm.gamma, float)
    assert cfg.runner.progress_bar is False
    assert cfg.actor.model.policy_hidden_sizes == [64, 64]
    assert cfg.env.name == "ant"
    assert cfg.cluster.num_devices == "2"
    assert cfg.runner.experiment_name == "a b"


def test_later_override_wins():
    assert load_config(overrides=["runner.seed=1", "runner.seed=7"]).runner.seed == 7


def test_base_recipe_chain(tmp_path):
    write(tmp_path, "root", """
        runner: {experiment_name: root, seed: 3}
        actor: {model: {policy_hidden_sizes: [8, 8, 8]}}
    """)
    write(tmp_path, "mid", """
        base: root
        env: {name: ant}
        actor: {model: {policy_hidden_sizes: [16]}}
    """)
    write(tmp_path, "leaf", """
        base: mid
        runner: {experiment_name: leaf}
    """)
    cfg = load_config("leaf", ["runner.max_steps=7"], config_dir=tmp_path)
    assert cfg.runner.experiment_name == "leaf"
    assert cfg.runner.seed == 3                      # from root, through mid
    assert cfg.env.name == "ant"
    assert cfg.actor.model.policy_hidden_sizes == [16]   # lists are replaced, not merged
    assert cfg.runner.max_steps == 7
    assert sorted(list_recipes(tmp_path)) == ["leaf", "mid", "root"]


def test_base_can_name_a_packaged_recipe_when_config_dir_is_default(tmp_path):
    p = write(tmp_path, "custom", """
        base: ppo_brax
        env: {name: hopper}
    """)
    cfg = load_config(str(p))
    assert cfg.env.name == "hopper" and cfg.runner.max_steps == load_config().runner.max_steps


def test_resolved_yaml_round_trips(tmp_path):
    cfg = load_config(overrides=["actor.model.policy_hidden_sizes=[64,64]", "actor.optim.lr=1e-4", "env.name=ant"])
    p = tmp_path / "config.yaml"
    p.write_text(config_to_yaml(cfg))
    assert load_config_file(p) == cfg
    assert load_config(str(p)) == cfg
    assert load_config_file(p, ["runner.seed=9"]).runner.seed == 9


def test_a_saved_config_with_the_flat_model_names_reads_as_the_nested_keys(tmp_path):
    # Run folders saved before the model's keys were nested by kind hold actor.model.lm_*,
    # vla_* and pi0_*; they load to the same config the nested names give.
    cfg = load_config("ppo_pi0_tabletop", ["actor.model.lm.hidden_size=32", "actor.model.vla.n_bins=16",
                                           "actor.model.pi0.num_steps=3"])
    text = config_to_yaml(cfg)
    flat = []
    for line in text.splitlines():
        stripped = line.strip()
        if line in ("    lm:", "    vla:", "    pi0:"):  # actor.model's sections (not algorithm.lm)
            kind = stripped[:-1]
            continue
        if line.startswith("      ") and not line.startswith("       "):
            flat.append(f"    {kind}_{stripped}")  # one level up, prefixed
        else:
            flat.append(line)
    old = tmp_path / "config.yaml"
    old.write_text("\n".join(flat) + "\n")
    assert "    lm_hidden_size: 32" in old.read_text() and "    pi0_num_steps: 3" in old.read_text()
    assert load_config_file(old) == cfg
    both = tmp_path / "both.yaml"
    both.write_text(old.read_text().replace("  model:\n", "  model:\n    lm:\n      hidden_size: 8\n", 1))
    with pytest.raises(BadInput, match="actor.model.lm_hidden_size and actor.model.lm.hidden_size are both set"):
        load_config_file(both)


def test_an_old_flat_model_name_is_one_error_line_naming_the_new_key(tmp_path):
    msg = bad(["actor.model.lm_hidden_size=64"], name="sft_math")
    assert "actor.model.lm_hidden_size" in msg and "is now called actor.model.lm.hidden_size" in msg
    write(tmp_path, "r", """
        actor:
          model:
            pi0_num_steps: 2
    """)
    msg = bad(name="r", config_dir=tmp_path)
    assert "actor.model.pi0_num_steps in recipe r.yaml is now called actor.model.pi0.num_steps" in msg


def test_a_saved_config_with_the_flat_algorithm_names_reads_as_the_family_sections(tmp_path):
    # Run folders saved before the algorithm's keys were nested by family hold
    # algorithm.utd_ratio, algorithm.group_size, ... at the top of the section.
    cfg = load_config("sac_brax", ["algorithm.offpolicy.utd_ratio=4", "algorithm.offpolicy.tau=0.01",
                                   "algorithm.gamma=0.9"])
    saved = yaml.safe_load(config_to_yaml(cfg))
    section = saved["algorithm"]
    section.update({**section.pop("offpolicy"), **section.pop("lm")})
    assert section["utd_ratio"] == 4 and section["tau"] == 0.01 and "offpolicy" not in section
    old = tmp_path / "config.yaml"
    old.write_text(yaml.safe_dump(saved))
    assert load_config_file(old) == cfg
    section["offpolicy"] = {"utd_ratio": 2}
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump(saved))
    with pytest.raises(BadInput, match="algorithm.utd_ratio and algorithm.offpolicy.utd_ratio are both set"):
        load_config_file(both)


def test_an_old_flat_algorithm_name_is_one_error_line_naming_the_new_key():
    msg = bad(["algorithm.utd_ratio=4"], name="sac_brax")
    assert "algorithm.utd_ratio" in msg and "is now called algorithm.offpolicy.utd_ratio" in msg
    msg = bad(["algorithm.kl_coef=0.1"], name="grpo_math")
    assert "is now called algorithm.lm.kl_coef" in msg


def test_resume_accepts_existing_path(tmp_path):
    assert load_config(overrides=[f"runner.resume={tmp_path}"]).runner.resume == str(tmp_path)
    assert load_config(overrides=["runner.resume=auto"]).runner.resume == "auto"


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("overrides, must_contain", [
    (["runner.max_step=10"], ["runner.max_step", "did you mean runner.max_steps?"]),
    (["runnr.max_steps=10"], ["did you mean runner.max_steps?"]),
    (["runner.lr=1"], ["did you mean actor.optim.lr?"]),
    (["runner.foo=1"], ["runner.foo", "valid keys under runner", "max_steps"]),
    (["foo=1"], ["'foo'", "top-level sections"]),
    (["runner=3"], ["runner", "mapping"]),
    (["runner.max_steps=abc"], ["runner.max_steps expects an int, got 'abc'"]),
    (["runner.max_steps=1.5"], ["runner.max_steps expects an int, got 1.5"]),
    (["actor.optim.lr=fast"], ["actor.optim.lr expects a float, got 'fast'"]),
    (["runner.progress_bar=maybe"], ["runner.progress_bar expects a bool"]),
    (["actor.model.policy_hidden_sizes=64"], ["actor.model.policy_hidden_sizes expects a list of ints"]),
    (["actor.model.policy_hidden_sizes=[a,b]"], ["actor.model.policy_hidden_sizes expects a list of ints"]),
    (["actor.model.policy_hidden_sizes.x=1"], ["actor.model.policy_hidden_sizes expects a list of ints"]),
    (["runner.seed="], ["runner.seed expects an int, got null"]),
    (["runner.max_steps"], ["malformed override", "key=value"]),
    (["=5"], ["malformed override"]),
    (["runner.seed=[1"], ["runner.seed=[1", "cannot parse"]),
    (["runner.max_steps=0"], ["runner.max_steps=0", ">= 1"]),
    (["runner.save_interval=-1"], ["runner.save_interval=-1", ">= 0"]),
    (["runner.eval_interval=-1"], ["runner.eval_interval=-1"]),
    (["runner.log_interval=-2"], ["runner.log_interval=-2"]),
    (["runner.keep_checkpoints=0"], ["runner.keep_checkpoints=0", ">= 1"]),
    (["env.num_envs=0"], ["env.num_envs=0"]),
    (["env.num_eval_envs=0"], ["env.num_eval_envs=0"]),
    (["algorithm.rollout_length=0"], ["algorithm.rollout_length=0"]),
    (["algorithm.update_epochs=0"], ["algorithm.update_epochs=0"]),
    (["algorithm.num_minibatches=0"], ["algorithm.num_minibatches=0"]),
    (["algorithm.gamma=1.5"], ["algorithm.gamma=1.5", "[0, 1]"]),
    (["algorithm.gae_lambda=-0.1"], ["algorithm.gae_lambda=-0.1", "[0, 1]"]),
    (["algorithm.clip_eps=0"], ["algorithm.clip_eps=0", "> 0"]),
    (["actor.optim.lr=0"], ["actor.optim.lr=0", "> 0"]),
    (["algorithm.num_minibatches=7"], ["not divisible", "algorithm.num_minibatches=7", "e.g. set algorithm.num_minibatches="]),
    (["env.num_envs=3", "algorithm.rollout_length=5", "algorithm.num_minibatches=4"], ["3 * 5 = 15"]),
    (["runner.resume=/definitely/not/here"], ["runner.resume", "/definitely/not/here", "no such path"]),
    (["actor.optim.lr_schedule=cosine"], ["actor.optim.lr_schedule='cosine'", "constant, linear"]),
    (["cluster.num_devices=0"], ["cluster.num_devices='0'", "'all' or a positive integer"]),
    (["cluster.num_devices=many"], ["cluster.num_devices='many'"]),
    (["cluster.scaling=sometimes"], ["cluster.scaling='sometimes'", "static, dynamic"]),
    (["cluster.scaling=dynamic"], ["cluster.scaling=dynamic", "component_placement=disaggregated"]),
    (["actor.model.activation=sigmoid"], ["actor.model.activation='sigmoid'", "relu", "swish"]),
    (["actor.model.vla.logprob_level=slot"], ["actor.model.vla.logprob_level='slot'", "chunk, action or token"]),
    (["actor.model.kind=pi0", "actor.model.vla.logprob_level=token"], ["vla.logprob_level=token", "set it to chunk"]),
])
def test_bad_overrides(overrides, must_contain):
    msg = bad(overrides)
    for part in must_contain:
        assert part in msg, (part, msg)


def test_activation_aliases_accepted():
    for act in ("relu", "tanh", "swish", "silu", "gelu", "elu"):
        assert load_config(overrides=[f"actor.model.activation={act}"]).actor.model.activation == act


def test_unknown_recipe_lists_available():
    msg = bad(name="ppo_brx")
    assert "ppo_brx" in msg and "did you mean ppo_brax?" in msg and "available recipes: " in msg


def test_a_recipe_name_with_its_yaml_suffix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ppo_brax.yaml here: the packaged recipe is meant
    assert load_config("ppo_brax.yaml") == load_config("ppo_brax")
    msg = bad(name="ppo_brx.yaml")
    assert "ppo_brx.yaml does not exist" in msg and "did you mean ppo_brax?" in msg
    # A file of that name where the command runs is the file, not the recipe.
    (tmp_path / "ppo_brax.yaml").write_text("runner:\n  max_steps: 7\n")
    assert load_config("ppo_brax.yaml").runner.max_steps == 7


def test_unknown_key_in_recipe_yaml(tmp_path):
    write(tmp_path, "r", """
        runner:
          max_step: 5
    """)
    msg = bad(name="r", config_dir=tmp_path)
    assert "runner.max_step" in msg and "r.yaml" in msg and "did you mean runner.max_steps?" in msg


def test_wrong_type_in_recipe_yaml(tmp_path):
    write(tmp_path, "r", "env: {num_envs: lots}\n")
    msg = bad(name="r", config_dir=tmp_path)
    assert "env.num_envs expects an int, got 'lots'" in msg and "r.yaml" in msg


def test_invalid_yaml_names_the_line(tmp_path):
    write(tmp_path, "r", "runner:\n  seed: [1,\n")
    msg = bad(name="r", config_dir=tmp_path)
    assert "not valid YAML" in msg and "line" in msg


def test_duplicate_yaml_key(tmp_path):
    write(tmp_path, "r", "runner:\n  seed: 1\n  seed: 2\n")
    assert "duplicate key" in bad(name="r", config_dir=tmp_path)


def test_non_mapping_recipe(tmp_path):
    write(tmp_path, "r", "- 1\n- 2\n")
    assert "mapping" in bad(name="r", config_dir=tmp_path)


def test_missing_and_looping_base(tmp_path):
    write(tmp_path, "r", "base: nothere\n")
    assert "unknown recipe 'nothere'" in bad(name="r", config_dir=tmp_path)
    write(tmp_path, "a", "base: b\n")
    write(tmp_path, "b", "base: a\n")
    assert "loops" in bad(name="a", config_dir=tmp_path)


def test_missing_config_file(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        load_config_file(tmp_path / "nope.yaml")
    assert "does not exist" in bad(name=str(tmp_path / "nope.yaml"))


def test_file_path_recipe_with_sibling_base_and_interpolation(tmp_path):
    write(tmp_path, "mine", "env: {name: ant}\n")
    p = write(tmp_path, "child", """
        base: mine
        runner: {experiment_name: "${env.name}_run"}
    """)
    assert load_config(str(p)).runner.experiment_name == "ant_run"
    write(tmp_path, "broken", "runner: {seed: '${nope}'}\n")
    msg = bad(name="broken", config_dir=tmp_path)
    assert "runner.seed" in msg and "nope" in msg


# ------------------------------------------------------------------ keys a task reads
@pytest.mark.parametrize("name", list_recipes())
def test_every_packaged_recipe_sets_only_keys_its_task_reads(name):
    from rlinf_jax.tasks.registry import load_run_config

    warnings = []
    load_run_config(name, warn=warnings.append)
    assert warnings == []


@pytest.mark.parametrize("recipe, override, fragment", [
    ("ppo_brax", "algorithm.lm.clip_high=0.28", "clips both sides with algorithm.clip_eps"),
    ("ppo_brax", "data.rollout_batch_size=8", "is not read by an embodied run"),
    ("ppo_brax", "env.layout=task", "is not read by an embodied run"),  # a tabletop key on brax
    ("ppo_brax", "actor.model.vla.n_bins=64", "is not read by an embodied run"),
    ("grpo_math", "env.num_envs=4", "prompts per iteration are data.rollout_batch_size"),
    ("grpo_math", "algorithm.clip_eps=0.2", "clips with algorithm.lm.clip_low and algorithm.lm.clip_high"),
    ("grpo_math", "flow.num_micro_batches=2", "is not read by a reasoning run"),
    ("sft_math", "sft.lr=1e-4", "an sft run learns at actor.optim.lr"),
    ("sft_vla_tabletop", "actor.optim.lr=1e-4", "clones at sft.lr"),
    ("ppo_pi0_tabletop", "actor.model.vla.n_bins=16", "of actor.model.kind=pi0"),
])
def test_a_key_the_task_would_ignore_is_one_error_line(recipe, override, fragment, capsys):
    from rlinf_jax.cli.train import main

    assert main(["--config-name", recipe, override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and fragment in err, err
    assert f"in override '{override}'" in err


def test_a_key_only_a_base_recipe_set_is_named_in_one_warning(tmp_path):
    from rlinf_jax.tasks.registry import load_run_config

    # An SFT recipe built on the PPO recipe: the PPO keys it inherits change nothing.
    (tmp_path / "clone.yaml").write_text("base: ppo_vla_tabletop\nrunner:\n  task: sft\n")
    warnings = []
    cfg = load_run_config(str(tmp_path / "clone.yaml"), warn=warnings.append)
    assert cfg.runner.task == "sft"
    (line,) = warnings
    assert line.startswith("an sft run of actor.model.kind=vla does not read ") and "\n" not in line
    assert "algorithm.clip_eps" in line and "sft.critic_warmup_steps" in line and "ppo_vla_tabletop.yaml" in line
    # Keys the base leaves at their defaults are not named.
    assert "algorithm.normalize_advantages" not in line


def test_a_runs_saved_config_is_a_config_to_rerun_it_and_only_its_overrides_are_checked(tmp_path):
    from rlinf_jax.errors import BadInput
    from rlinf_jax.tasks.registry import load_run_config
    from rlinf_jax.tasks.reasoning.run import sft_warm_start_config

    # A reasoning recipe's warm start saves a resolved sft config that still holds the
    # reasoning keys (env.*, algorithm.*) an sft run does not read: it is a record of the
    # run, so given back as the config (to extend that run, say) it loads as it was saved.
    warm = sft_warm_start_config(load_run_config("grpo_tool_calc"))
    saved = tmp_path / "config.yaml"
    saved.write_text(config_to_yaml(warm))
    warnings = []
    cfg = load_run_config(str(saved), ["runner.max_steps=900"], warn=warnings.append)
    assert cfg == load_config_file(saved, ["runner.max_steps=900"]) and warnings == []
    # What the command line adds is checked as always.
    with pytest.raises(BadInput, match="is not read by an sft run"):
        load_run_config(str(saved), ["algorithm.lm.group_size=4"])
    # A partial file is a recipe of the user's own: its keys are checked.
    partial = tmp_path / "partial.yaml"
    data = yaml.safe_load(saved.read_text())
    del data["runner"]["seed"]
    partial.write_text(yaml.safe_dump(data))
    with pytest.raises(BadInput, match="is not read by an sft run"):
        load_run_config(str(partial))


def test_a_backbone_other_than_the_models_own_is_refused():
    from rlinf_jax.errors import BadInput
    from rlinf_jax.tasks.registry import load_run_config

    with pytest.raises(BadInput, match="built on a llama backbone"):
        load_run_config("ppo_vla_tabletop", ["actor.model.lm.model_type=qwen2"])
    with pytest.raises(BadInput, match="clones a VLA"):
        load_run_config("sft_math", ["actor.model.kind=pi0"])

"""Recipes -> typed ``Config``: YAML layers, dotted overrides, type and sanity checks.

A recipe is ``configs/NAME.yaml``. It may name a parent with a top-level ``base: OTHER``
and then only lists what differs. Overrides are Hydra-style ``a.b.c=value`` strings whose
values are parsed as YAML (``10`` is an int, ``[64,64]`` a list, ``1e-3`` a float).

We check keys ourselves before OmegaConf sees them, because its errors are multi-line
and cannot suggest the key the user meant; types are left to OmegaConf's structured
merge (it knows the dataclass annotations) and its errors are rewritten onto one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import typing
from pathlib import Path
from typing import Any, Iterable

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

try:
    from omegaconf._utils import get_yaml_loader
except ImportError:  # pragma: no cover  (private API)
    get_yaml_loader = None

from rlinf_jax.config.schema import (
    Config,
    LMAlgorithmSection,
    LMSection,
    OffPolicySection,
    Pi0Section,
    VLASection,
)
from rlinf_jax.errors import BadInput

RECIPE_DIR = Path(__file__).resolve().parent.parent / "configs"
BASE_KEY = "base"
LR_SCHEDULES = ("constant", "linear")
RESUME_WORDS = ("none", "auto")
EVAL_EPISODES = ("fresh", "fixed")


def _one_line(msg: str) -> str:
    # Values echoed back to the user may contain newlines; the CLI promises one line.
    return " ".join(str(msg).split())


def _bad(msg: str) -> BadInput:
    return BadInput(_one_line(msg))


# --------------------------------------------------------------------------- schema walk


def _schema_leaves(cls=Config, prefix: str = "") -> dict[str, Any]:
    """Dotted path of every leaf field -> its annotated type (sections excluded)."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(_schema_leaves(tp, path + "."))
        else:
            out[path] = tp
    return out


def _schema_sections(cls=Config, prefix: str = "") -> set[str]:
    out: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.add(prefix + f.name)
            out |= _schema_sections(tp, prefix + f.name + ".")
    return out


LEAVES = _schema_leaves()
SECTIONS = _schema_sections()
# Leaves that hold free-form mappings (component names, mesh axes, logical axes); their
# keys are checked against the recipe's components when the placement is resolved.
# Mappings whose keys are the user's own (mesh axes, a simulator's keyword arguments).
OPEN_LEAVES = {"cluster.component_placement", "cluster.mesh", "cluster.partition_rules", "env.gym_kwargs",
               "agent.skyrl_env_config"}
# The model's keys once sat flat in actor.model with their kind as a prefix (lm_hidden_size);
# they are nested by kind now (lm.hidden_size). The algorithm's keys of one family once sat
# flat in algorithm (algorithm.utd_ratio); they are nested by family now
# (algorithm.offpolicy.utd_ratio). Old name -> new name, for the one-line error that names
# the new key and for reading run folders saved with the old names.
RENAMED = {
    **{
        f"actor.model.{kind}_{f.name}": f"actor.model.{kind}.{f.name}"
        for kind, section in (("lm", LMSection), ("vla", VLASection), ("pi0", Pi0Section))
        for f in dataclasses.fields(section)
    },
    **{
        f"algorithm.{f.name}": f"algorithm.{family}.{f.name}"
        for family, section in (("lm", LMAlgorithmSection), ("offpolicy", OffPolicySection))
        for f in dataclasses.fields(section)
    },
}
FLOW_RUNNERS = ("fused", "staged", "auto")
PLACEMENT_PRESETS = ("collocated", "disaggregated", "hybrid", "auto")
SCALINGS = ("static", "dynamic")


def _type_phrase(tp) -> str:
    if tp is bool:
        return "a bool (true/false)"
    if tp is int:
        return "an int"
    if tp is float:
        return "a float"
    if tp is str:
        return "a string"
    if typing.get_origin(tp) is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"a list of {_type_phrase(inner).split(' ', 1)[1]}s, e.g. [64,64]"
    return f"a {getattr(tp, '__name__', tp)}"


def _show(value) -> str:
    if value is None:
        return "null (an empty value)"
    if isinstance(value, str):
        return repr(value)
    return _one_line(yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("..."))


# --------------------------------------------------------------------------- key checks


def _suggest(path: str) -> str:
    section, _, name = path.rpartition(".")
    # A known key name in the wrong section (runner.lr) is the likeliest slip of all.
    elsewhere = [k for k in LEAVES if k.rpartition(".")[2] == name]
    if elsewhere:
        return f"did you mean {elsewhere[0]}?"
    if section in SECTIONS:
        siblings = [k.rpartition(".")[2] for k in LEAVES if k.rpartition(".")[0] == section]
        close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
        if close:
            return f"did you mean {section}.{close[0]}?"
        return f"valid keys under {section}: {', '.join(sorted(siblings))}"
    close = difflib.get_close_matches(path, list(LEAVES) + sorted(SECTIONS), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    return f"top-level sections are: {', '.join(sorted(s for s in SECTIONS if '.' not in s))}"


def _unknown_key(path: str, where: str) -> BadInput:
    return _bad(f"unknown config key {path!r} {where}; {_suggest(path)}")


def _check_keys(tree: dict, where: str, prefix: str = "") -> None:
    """Every key of ``tree`` must be a schema section (holding a mapping) or leaf."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if path in OPEN_LEAVES:
            continue
        if path in SECTIONS:
            if not isinstance(value, dict):
                example = next(k for k in LEAVES if k.startswith(path + "."))
                raise _bad(
                    f"{path} {where} is a section and must hold a mapping of keys, got {_show(value)}; "
                    f"set its keys one by one, e.g. {example}=..."
                )
            _check_keys(value, where, path + ".")
        elif path in RENAMED:
            raise _bad(f"{path} {where} is now called {RENAMED[path]}; rename it")
        elif path not in LEAVES:
            # Report the full dotted path (runnr.max_steps, not runnr) so the suggestion
            # can point at the exact key meant.
            while isinstance(value, dict) and value:
                key, value = next(iter(value.items()))
                path = f"{path}.{key}"
            raise _unknown_key(path, where)
        elif isinstance(value, dict):
            # Caught here because OmegaConf's error for this names neither side well.
            raise _bad(f"{path} expects {_type_phrase(LEAVES[path])}, got {_show(value)} {where}")


# --------------------------------------------------------------------------- YAML layers


def list_recipes(config_dir: str | os.PathLike | None = None) -> list[str]:
    """Names of the recipes in ``config_dir`` (default: the packaged ``configs/``).

    Files whose names start with ``_`` are fragments: shared settings that recipes build
    on with ``base:``, not runs of their own, so they are not listed.
    """
    d = Path(config_dir) if config_dir is not None else RECIPE_DIR
    return sorted(p.stem for p in d.glob("*.yaml") if not p.stem.startswith("_"))


# A config is a few hundred lines: bounds far above any real one and far below what a
# crafted file (an alias "billion laughs", a megabyte of nesting) would cost to expand.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_NODES = 100_000


def _expanded_nodes(root: yaml.Node) -> int:
    """How many nodes the document has once every alias is expanded (capped just above
    ``MAX_CONFIG_NODES``), computed over the distinct nodes only, so the count costs what
    the file does, not what its expansion would. A node that contains itself is infinite."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            return MAX_CONFIG_NODES + 1
        on_path.add(key)
        n = 1
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                n += size(k) + size(v)
                if n > MAX_CONFIG_NODES:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for v in node.value:
                n += size(v)
                if n > MAX_CONFIG_NODES:
                    break
        on_path.discard(key)
        sizes[key] = n = min(n, MAX_CONFIG_NODES + 1)
        return n

    return size(root)


def _read_yaml(path: Path, label: str) -> dict:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise _bad(f"cannot read {label} {path}: {e.strerror or e}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise _bad(f"{label} {path} is {len(raw):,} bytes, more than a config can be ({MAX_CONFIG_BYTES:,}); point at the right file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _bad(f"{label} {path} is not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        if not text.strip():
            data = {}
        else:
            loader = _yaml_loader()(text)
            try:
                node = loader.get_single_node()
                if node is not None and _expanded_nodes(node) > MAX_CONFIG_NODES:
                    raise _bad(
                        f"{label} {path} expands to more than {MAX_CONFIG_NODES:,} values through its aliases "
                        "(& / *); write the config out plainly"
                    )
                data = loader.construct_document(node) if node is not None else {}
            finally:
                loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise _bad(f"{label} {path} is not valid YAML{at}: {problem}") from None
    except RecursionError:
        raise _bad(f"{label} {path} is nested too deeply to be a config; write it out plainly") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise _bad(f"{label} {path} must hold a mapping of sections (runner:, env:, ...), got {_show(data)}")
    for key in data:
        if not isinstance(key, str):
            raise _bad(f"{label} {path} has a non-string top-level key {key!r}; keys are section names like runner")
    return data


def _yaml_loader():
    # OmegaConf's YAML flavour (``1e-3`` is a float, duplicate keys are errors), so a
    # recipe reads exactly like an override. It is private API, hence the fallback.
    return yaml.SafeLoader if get_yaml_loader is None else get_yaml_loader()


def _recipe_path(name: str, config_dir: Path) -> Path:
    path = config_dir / f"{name}.yaml"
    if not path.is_file():
        available = list_recipes(config_dir)
        close = difflib.get_close_matches(name, available, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise _bad(
            f"unknown recipe {name!r} (no {path}); {hint}available recipes: {', '.join(available) or '(none)'}"
        )
    return path


def _load_layers(path: Path, label: str, config_dir: Path, chain: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """The recipe and its ``base:`` ancestors, oldest first, as (description, mapping)."""
    data = _read_yaml(path, label)
    where = f"in {label} {path.name}"
    parent = data.pop(BASE_KEY, None)
    layers: list[tuple[str, dict]] = []
    if parent is not None:
        if not isinstance(parent, str) or not parent:
            raise _bad(f"'{BASE_KEY}' {where} must be a recipe name, got {_show(parent)}")
        if parent in chain or parent == path.stem:
            cycle = " -> ".join((*chain, path.stem, parent))
            raise _bad(f"recipe base chain loops ({cycle}); remove one of the '{BASE_KEY}:' lines")
        # A sibling file first, so a user's own folder of recipes can chain.
        sibling = path.parent / f"{parent}.yaml"
        parent_path = sibling if sibling.is_file() else _recipe_path(parent, config_dir)
        layers = _load_layers(parent_path, "recipe", config_dir, (*chain, path.stem))
    layers.append((where, data))
    return layers


# --------------------------------------------------------------------------- overrides


def _parse_override(text: str) -> tuple[str, Any]:
    if not isinstance(text, str) or "=" not in text:
        raise _bad(f"malformed override {text!r}: expected key=value, e.g. runner.max_steps=10")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise _bad(f"malformed override {text!r}: the key before '=' must be a dotted path like runner.max_steps")
    try:
        # OmegaConf's dotlist parser gives us its YAML value grammar; a placeholder key
        # keeps the user's key out of its parsing (we nest it ourselves).
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]
    except (yaml.YAMLError, OmegaConfBaseException) as e:
        first = str(getattr(e, "problem", None) or e).splitlines()[0]
        raise _bad(f"override {text!r}: cannot parse the value {raw!r} ({first}); quote strings, write lists as [1,2]")
    return key, value


def _nest(key: str, value) -> dict:
    for part in reversed(key.split(".")):
        value = {part: value}
    return value


# --------------------------------------------------------------------------- build


def _merge_layer(cfg, layer: dict, where: str):
    try:
        return OmegaConf.merge(cfg, layer)
    except OmegaConfBaseException as e:
        raise _rewrite_type_error(e, layer, where) from None


def _dig(tree: dict, path: str):
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _rewrite_type_error(e: OmegaConfBaseException, layer: dict, where: str) -> BadInput:
    full_key = str(getattr(e, "full_key", "") or "")
    leaf = full_key.split("[", 1)[0]
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, InterpolationResolutionError):
        return _bad(f"{leaf or 'config'}: cannot resolve its ${{...}} reference ({first}); point it at an existing key")
    if leaf in LEAVES:
        value = _dig(layer, leaf)
        expects = _type_phrase(LEAVES[leaf])
        got = _show(value)
        return _bad(f"{leaf} expects {expects}, got {got} {where}".rstrip())
    return _bad(f"invalid config {where}: {first}" if where else f"invalid config: {first}")


@dataclasses.dataclass
class Origins:
    """Where each key a run's config sets explicitly came from: the recipe's own file or an
    override (``explicit``), or a ``base:`` recipe it builds on (``inherited``). Keys left
    at their schema default appear in neither. ``overridden`` holds the keys an override
    set (the command line's ``key=value``), the user's word over any recipe."""

    explicit: dict[str, str] = dataclasses.field(default_factory=dict)
    inherited: dict[str, str] = dataclasses.field(default_factory=dict)
    overridden: set[str] = dataclasses.field(default_factory=set)


def _leaf_paths(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in OPEN_LEAVES and path in SECTIONS:
            yield from _leaf_paths(value, path + ".")
        else:
            yield path


def _is_resolved(data: dict) -> bool:
    """Whether a layer sets every leaf of the schema (`config_to_yaml`'s output)."""
    return set(LEAVES) <= set(_leaf_paths(data))


def _build(layers: list[tuple[str, dict]], overrides: Iterable[str]) -> tuple[Config, Origins]:
    cfg = OmegaConf.structured(Config)
    origins = Origins()
    for i, (where, data) in enumerate(layers):
        _check_keys(data, where)
        cfg = _merge_layer(cfg, data, where)
        if _is_resolved(data):
            # A run's saved config.yaml spells out every key, read or not by its task: a
            # record of the run, not choices to check. Given as the config (to rerun or
            # extend that run), it sets what it holds and only overrides are checked.
            continue
        own = i == len(layers) - 1
        for path in _leaf_paths(data):
            (origins.explicit if own else origins.inherited)[path] = where
            if own:
                origins.inherited.pop(path, None)
    if overrides is None:
        overrides = ()
    elif isinstance(overrides, str):
        # A lone string would otherwise be split into characters.
        overrides = [overrides]
    for text in overrides:
        key, value = _parse_override(text)
        where = f"in override {text!r}"
        layer = _nest(key, value)
        _check_keys(layer, where)
        cfg = _merge_layer(cfg, layer, where)
        for path in _leaf_paths(layer):
            origins.explicit[path] = where
            origins.inherited.pop(path, None)
            origins.overridden.add(path)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise _rewrite_type_error(e, {}, "") from None
    validate(obj)
    return obj, origins


def compose(
    config_name: str = "ppo_brax",
    overrides: Iterable[str] = (),
    config_dir: str | os.PathLike | None = None,
) -> tuple[Config, Origins]:
    """`load_config`, and where every explicitly set key came from (`Origins`)."""
    recipe_dir = Path(config_dir) if config_dir is not None else RECIPE_DIR
    if str(config_name).endswith((".yaml", ".yml")) or os.sep in str(config_name):
        path = Path(config_name)
        if not path.is_file() and os.sep not in str(config_name) and path.stem in list_recipes(recipe_dir):
            # `ppo_brax.yaml` with no such file here: the packaged recipe of that name.
            path = recipe_dir / f"{path.stem}.yaml"
        if not path.is_file():
            raise _bad(_missing_config_file(str(config_name), recipe_dir))
        layers = _load_layers(path, "config file", recipe_dir)
    else:
        layers = _load_layers(_recipe_path(str(config_name), recipe_dir), "recipe", recipe_dir)
    return _build(layers, overrides)


def _missing_config_file(name: str, recipe_dir: Path) -> str:
    available = list_recipes(recipe_dir)
    close = difflib.get_close_matches(Path(name).stem, available, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"config file {name} does not exist; {hint}pass a recipe name ({', '.join(available)}) "
            "or an existing .yaml path")


def load_config(
    config_name: str = "ppo_brax",
    overrides: Iterable[str] = (),
    config_dir: str | os.PathLike | None = None,
) -> Config:
    """Loads recipe ``config_name`` (or a path to a YAML file), applies overrides, validates.

    Raises ``BadInput`` with a one-line message for anything the user can fix.
    """
    return compose(config_name, overrides, config_dir)[0]


def load_config_file(path: str | os.PathLike, overrides: Iterable[str] = ()) -> Config:
    """Loads a resolved config (e.g. a run directory's config.yaml) with full validation."""
    path = Path(path)
    if not path.is_file():
        raise _bad(f"config file {path} does not exist")
    layers = [(where, _renamed_to_nested(data, where)) for where, data in _load_layers(path, "config file", RECIPE_DIR)]
    return _build(layers, overrides)[0]


def _renamed_to_nested(data: dict, where: str) -> dict:
    """A saved config with old flat names (``RENAMED``), written by an earlier version, as
    the nested keys they mean now; a run folder keeps resuming across the renames."""
    for old, new in RENAMED.items():
        old_parent, _, name = old.rpartition(".")
        parent = _dig(data, old_parent)
        if not isinstance(parent, dict) or name not in parent:
            continue
        section_path, _, key = new.rpartition(".")
        section = _dig(data, section_path) or {}
        if not isinstance(section, dict) or key in section:
            raise _bad(f"{old} and {new} are both set {where}; keep {new} only")
        data = _with(data, old_parent, {k: v for k, v in parent.items() if k != name})
        data = _with(data, section_path, {**section, key: parent[name]})
    return data


def _with(tree: dict, path: str, value) -> dict:
    """``tree`` with the node at dotted ``path`` replaced by ``value`` (copies, no mutation)."""
    head, _, rest = path.partition(".")
    return {**tree, head: _with(tree.get(head) or {}, rest, value) if rest else value}


def config_to_yaml(cfg: Config) -> str:
    """Every key spelled out; ``load_config_file`` reads it back to an equal ``Config``."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


# --------------------------------------------------------------------------- semantics


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise _bad(msg)


def validate(cfg: Config) -> None:
    """Checks that values make sense on their own and together, section by section. What
    depends on a task (which model kinds, activations or LM families exist, the language
    model sections) is the task's to check (`rlinf_jax.tasks.registry.load_run_config`);
    env names are the env registry's."""
    _validate_runner(cfg.runner)
    _validate_env_and_batch(cfg.env, cfg.algorithm, cfg.flow)
    _validate_algorithm(cfg.algorithm)
    _validate_optim(cfg.actor.optim)
    _validate_model(cfg.actor.model)
    _validate_cluster(cfg.cluster)
    _validate_sft(cfg.sft)


def _validate_runner(r) -> None:
    _require(r.max_steps >= 1, f"runner.max_steps={r.max_steps} must be >= 1")
    for name in ("save_interval", "eval_interval", "log_interval"):
        v = getattr(r, name)
        _require(v >= 0, f"runner.{name}={v} must be >= 0 (0 disables it)")
    _require(r.eval_episodes in EVAL_EPISODES,
             f"runner.eval_episodes={r.eval_episodes!r} is not one of {', '.join(EVAL_EPISODES)}")
    _require(r.keep_checkpoints >= 1, f"runner.keep_checkpoints={r.keep_checkpoints} must be >= 1")
    _require(
        r.max_nonfinite_updates >= 1, f"runner.max_nonfinite_updates={r.max_nonfinite_updates} must be >= 1"
    )
    _require(bool(r.output_dir.strip()), "runner.output_dir is empty; set it to a folder, e.g. runner.output_dir=runs")
    _require(
        bool(r.experiment_name.strip()) and ".." not in Path(r.experiment_name).parts
        and not Path(r.experiment_name).is_absolute(),
        f"runner.experiment_name={r.experiment_name!r} must be a relative folder name inside runner.output_dir",
    )
    if r.resume not in RESUME_WORDS:
        _require(
            os.path.exists(r.resume),
            f"runner.resume={r.resume!r}: no such path; use none, auto, or a checkpoint path "
            "(a step folder or a checkpoints folder)",
        )


def _validate_env_and_batch(e, a, f) -> None:
    for name in ("num_envs", "num_eval_envs", "episode_length", "action_repeat"):
        v = getattr(e, name)
        _require(v >= 1, f"env.{name}={v} must be >= 1")
    for name in ("rollout_length", "update_epochs", "num_minibatches"):
        v = getattr(a, name)
        _require(v >= 1, f"algorithm.{name}={v} must be >= 1")
    _require(f.runner in FLOW_RUNNERS, f"flow.runner={f.runner!r} is unknown; choose one of {', '.join(FLOW_RUNNERS)}")
    _require(f.num_micro_batches >= 1, f"flow.num_micro_batches={f.num_micro_batches} must be >= 1")
    _require(
        e.num_envs % f.num_micro_batches == 0,
        f"env.num_envs={e.num_envs} is not divisible by flow.num_micro_batches={f.num_micro_batches}",
    )
    _require(f.max_staleness >= 0, f"flow.max_staleness={f.max_staleness} must be >= 0 (0 = on-policy)")


def _validate_algorithm(a) -> None:
    for name in ("gamma", "gae_lambda"):
        v = getattr(a, name)
        _require(0.0 <= v <= 1.0, f"algorithm.{name}={v} must be in [0, 1]")
    _require(a.clip_eps > 0, f"algorithm.clip_eps={a.clip_eps} must be > 0")
    for name in ("entropy_coef", "value_coef"):
        v = getattr(a, name)
        _require(math.isfinite(v) and v >= 0, f"algorithm.{name}={v} must be a finite number >= 0")
    _require(math.isfinite(a.reward_scale), f"algorithm.reward_scale={a.reward_scale} must be finite")
    lm = a.lm
    _require(lm.group_size >= 1, f"algorithm.lm.group_size={lm.group_size} must be >= 1")
    _require(0 < lm.clip_low < 1, f"algorithm.lm.clip_low={lm.clip_low} must be in (0, 1)")
    _require(math.isfinite(lm.clip_high) and lm.clip_high > 0, f"algorithm.lm.clip_high={lm.clip_high} must be > 0")
    _require(lm.dual_clip == 0 or lm.dual_clip > 1, f"algorithm.lm.dual_clip={lm.dual_clip} must be 0 (off) or > 1")
    _require(math.isfinite(lm.kl_coef) and lm.kl_coef >= 0, f"algorithm.lm.kl_coef={lm.kl_coef} must be >= 0 (0 = no KL)")
    _require(lm.max_resample >= 0, f"algorithm.lm.max_resample={lm.max_resample} must be >= 0")
    _require(math.isfinite(lm.value_clip) and lm.value_clip >= 0, f"algorithm.lm.value_clip={lm.value_clip} must be >= 0 (0 = off)")


def _validate_optim(o) -> None:
    _require(math.isfinite(o.lr) and o.lr > 0, f"actor.optim.lr={o.lr} must be > 0")
    _require(
        math.isfinite(o.max_grad_norm) and o.max_grad_norm >= 0,
        f"actor.optim.max_grad_norm={o.max_grad_norm} must be >= 0 (0 = no clipping)",
    )
    _require(0 <= o.b1 < 1, f"actor.optim.b1={o.b1} must be in [0, 1)")
    _require(
        o.lr_schedule in LR_SCHEDULES,
        f"actor.optim.lr_schedule={o.lr_schedule!r} is unknown; choose one of {', '.join(LR_SCHEDULES)}",
    )
    _require(o.warmup_steps >= 0, f"actor.optim.warmup_steps={o.warmup_steps} must be >= 0")
    _require(math.isfinite(o.weight_decay) and o.weight_decay >= 0, f"actor.optim.weight_decay={o.weight_decay} must be >= 0")
    _require(math.isfinite(o.critic_lr) and o.critic_lr > 0, f"actor.optim.critic_lr={o.critic_lr} must be > 0")


def _validate_model(m) -> None:
    for name in ("policy_hidden_sizes", "value_hidden_sizes"):
        sizes = getattr(m, name)
        _require(
            all(s >= 1 for s in sizes),
            f"actor.model.{name}={sizes} must hold positive layer widths, e.g. [64,64]",
        )
    _require(m.min_std >= 0, f"actor.model.min_std={m.min_std} must be >= 0")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                 "max_position_embeddings"):
        _require(getattr(m.lm, name) >= 1, f"actor.model.lm.{name}={getattr(m.lm, name)} must be >= 1")
    _require(m.lora_rank >= 0, f"actor.model.lora_rank={m.lora_rank} must be >= 0 (0 = full fine-tuning)")
    _require(math.isfinite(m.lora_alpha) and m.lora_alpha > 0, f"actor.model.lora_alpha={m.lora_alpha} must be > 0")
    for name in ("patch_size", "vision_hidden_size", "vision_layers", "vision_heads"):
        _require(getattr(m.vla, name) >= 1, f"actor.model.vla.{name}={getattr(m.vla, name)} must be >= 1")
    _require(m.vla.n_bins >= 2, f"actor.model.vla.n_bins={m.vla.n_bins} must be >= 2")
    _require(m.vla.temperature > 0, f"actor.model.vla.temperature={m.vla.temperature} must be > 0")
    _require(
        m.vla.logprob_level in ("chunk", "action", "token"),
        f"actor.model.vla.logprob_level={m.vla.logprob_level!r} is unknown; choose chunk, action or token",
    )
    for name in ("expert_hidden_size", "expert_intermediate_size", "num_steps"):
        _require(getattr(m.pi0, name) >= 1, f"actor.model.pi0.{name}={getattr(m.pi0, name)} must be >= 1")
    _require(
        m.pi0.expert_hidden_size % 2 == 0,
        f"actor.model.pi0.expert_hidden_size={m.pi0.expert_hidden_size} must be even (sin/cos time embedding)",
    )
    _require(
        m.pi0.method in ("flow_sde", "flow_noise"),
        f"actor.model.pi0.method={m.pi0.method!r} is unknown; choose flow_sde or flow_noise",
    )
    _require(
        not m.architecture or m.kind in ("vla", "pi0", "pi05", "gr00t"),
        f"actor.model.architecture={m.architecture!r} names a published VLA; it needs actor.model.kind=vla, pi0, pi05 "
        f"or gr00t "
        f"(not {m.kind})",
    )
    _require(
        math.isfinite(m.pi0.noise_level) and m.pi0.noise_level > 0,
        f"actor.model.pi0.noise_level={m.pi0.noise_level} must be a finite number > 0",
    )
    _require(
        math.isfinite(m.pi0.temperature) and m.pi0.temperature >= 0,
        f"actor.model.pi0.temperature={m.pi0.temperature} must be a finite number >= 0",
    )
    _require(m.pi0.state_bins >= 2, f"actor.model.pi0.state_bins={m.pi0.state_bins} must be >= 2")


def _validate_cluster(c) -> None:
    nd = c.num_devices
    _require(
        nd == "all" or (nd.isdigit() and int(nd) >= 1),
        f"cluster.num_devices={nd!r} must be 'all' or a positive integer, e.g. cluster.num_devices=1",
    )
    cp = c.component_placement
    if isinstance(cp, dict):
        _require(bool(cp), "cluster.component_placement is an empty mapping; name a preset or map components to devices")
    else:
        _require(
            cp in PLACEMENT_PRESETS,
            f"cluster.component_placement={_show(cp)} is neither a preset ({', '.join(PLACEMENT_PRESETS)}) nor a "
            "mapping like {env: 0-3, rollout: 4-7, actor: all}",
        )
    _require(c.scaling in SCALINGS, f"cluster.scaling={_show(c.scaling)} must be one of {', '.join(SCALINGS)}")
    _require(
        c.scaling == "static" or cp != "collocated",
        "cluster.scaling=dynamic lends devices between components, and a collocated run has every component on "
        "every device; use cluster.component_placement=disaggregated (or a mapping that keeps the actor apart from the "
        "rollout), or cluster.scaling=static",
    )
    for name, shape in c.mesh.items():
        _require(
            isinstance(shape, dict) and all(isinstance(v, int) or v == "all" for v in shape.values()),
            f"cluster.mesh.{name}={_show(shape)} must map mesh axes to sizes (one may be 'all'), e.g. "
            f"cluster.mesh.{name}={{data: 2, fsdp: 2}}",
        )
    _require(c.max_restarts >= 0, f"cluster.max_restarts={c.max_restarts} must be >= 0 (0 = never restart)")
    _require(
        math.isfinite(c.hang_timeout_s) and c.hang_timeout_s >= 0,
        f"cluster.hang_timeout_s={c.hang_timeout_s} must be >= 0 seconds (0 = no liveness check)",
    )


def _validate_sft(s) -> None:
    for name in ("warm_start_steps", "dagger_rounds", "critic_warmup_steps"):
        _require(getattr(s, name) >= 0, f"sft.{name}={getattr(s, name)} must be >= 0 (0 = off)")
    for name in ("batch_size", "num_demos", "dagger_episodes", "dagger_steps", "critic_warmup_episodes"):
        _require(getattr(s, name) >= 1, f"sft.{name}={getattr(s, name)} must be >= 1")
    _require(math.isfinite(s.lr) and s.lr > 0, f"sft.lr={s.lr} must be > 0")

"""The public Python API: what a notebook or a script needs, from the top-level package.

    import rlinf_jax as rj

    cfg = rj.load_config("ppo_brax", ["runner.max_steps=20"])
    result = rj.train(cfg)                      # what `python -m rlinf_jax.train` does
    result.metrics.plot("eval/return")          # the learning curve
    policy = rj.restore(result.run_dir)         # actions (control, VLA) or text (LM)
    rj.evaluate(result.run_dir)                 # what `python -m rlinf_jax.evaluate` does

The CLIs are thin wrappers over the same functions: `train` calls the task's run as
``python -m rlinf_jax.train`` does, `evaluate` dispatches as ``python -m rlinf_jax.evaluate``
does. Bad input raises `rlinf_jax.errors.BadInput` (its message is the CLI's ``error:``
line); nothing here calls ``sys.exit``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlinf_jax.config.schema import Config
from rlinf_jax.errors import BadInput

# Imports of JAX and of the code that runs it sit inside the functions: the command-line
# programs (rlinf_jax.cli) import this one and answer --help before JAX loads.

__all__ = [
    "Config", "LMSampler", "Metrics", "TrainResult", "convert", "evaluate", "list_envs", "list_recipes", "load_config",
    "make_env", "plan", "read_metrics", "restore", "train",
]

LM_TASKS = ("sft", "reasoning")


def list_recipes() -> list[str]:
    """The recipe names `load_config` takes (the YAML files in ``rlinf_jax/configs``)."""
    from rlinf_jax.config import list_recipes as recipes

    return list(recipes())


def list_envs() -> dict[str, list[str]]:
    """The envs of each suite, ``{suite: [name, ...]}`` (``env.suite`` / ``env.name``)."""
    from rlinf_jax.envs import list_envs as envs

    return {suite: list(names) for suite, names in envs().items()}


def make_env(cfg: Config, num_envs: int | None = None, evaluation: bool = False):
    """The batched env ``cfg.env`` describes (``num_envs`` of them, default
    ``env.num_envs``), or with ``evaluation`` the run's evaluation env (``env.num_eval_envs``,
    one episode each): ``env.reset(key)`` and ``env.step(state, action)`` are jittable."""
    from rlinf_jax.envs import make_env as make, make_eval_env
    from rlinf_jax.envs.mjx_import import import_mjx, uses_warp

    # As a run does (tasks/registry.py): MJX without its Warp backend unless the env steps
    # through it, seconds sooner in a notebook that builds an env before it trains.
    import_mjx(warp=uses_warp(cfg))
    return make_eval_env(cfg.env) if evaluation else make(cfg.env, num_envs)


def load_config(name: str = "ppo_brax", overrides: Sequence[str] | dict = (), config_dir=None) -> Config:
    """The checked config of a recipe with ``overrides`` (``["key=value", ...]`` as on the
    command line, or a ``{"key": value}`` dict). A key the recipe's task would ignore is an
    error, as on the command line; keys a base recipe set that the task ignores are named
    in one warning on stderr. The first config loaded in a process also sets the XLA CPU
    flags JAX starts with (``runner.xla_cpu_flags``)."""
    if not isinstance(name, str):
        raise BadInput(f"name must be a recipe name (a str; rj.list_recipes() lists them), not {_described(name)}")
    if config_dir is not None:
        _path_argument(config_dir, "config_dir", "a folder of recipes")
    overrides = _override_list(overrides)
    prepare_jax(name, overrides, config_dir)
    from rlinf_jax.tasks.registry import load_run_config

    return load_run_config(name, overrides, config_dir, warn=lambda m: print(f"warning: {m}", file=sys.stderr))


def prepare_jax(name: str | None = None, overrides: Sequence[str] = (), config_dir=None) -> None:
    """Puts the run's ``runner.xla_cpu_flags`` (the recipe ``name`` with ``overrides``; with
    no recipe, the overrides alone over the defaults) into XLA_FLAGS, before anything that
    starts JAX's backend is imported: the tasks' imports do."""
    from rlinf_jax.config.loader import compose
    from rlinf_jax.runtime.xla_flags import DEFAULT, apply_xla_cpu_flags

    setting = DEFAULT
    if name is not None:
        try:
            setting = compose(name, overrides, config_dir)[0].runner.xla_cpu_flags
        except BadInput:
            return  # the full load that follows reports it
    else:
        for item in overrides:
            key, _, value = item.partition("=")
            if key.strip() == "runner.xla_cpu_flags":
                setting = value.strip().strip("'\"")
    apply_xla_cpu_flags(setting)


def _override_list(overrides) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, dict):
        for key in overrides:
            if not isinstance(key, str):
                raise BadInput(f"overrides' keys must be config keys such as 'runner.max_steps', not {_described(key)}")
        return [f"{k}={_yaml_value(v)}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise BadInput(f"overrides must be a list of 'key=value' strings or a dict, not the string {overrides!r}")
    if not isinstance(overrides, Iterable):
        raise BadInput(f"overrides must be a list of 'key=value' strings or a dict, not {_described(overrides)}")
    items = list(overrides)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise BadInput(f"overrides[{i}] must be a 'key=value' string, not {_described(item)}")
    return items


def _yaml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_yaml_value(x) for x in v) + "]"
    if isinstance(v, (str, os.PathLike)):
        text = str(v)
        # Quoted so the loader keeps it a string ("" and "1e-3"-looking names included).
        return "'" + text.replace("'", "''") + "'"
    return repr(v)


# Each public function checks its arguments' types first, so a wrong one is a BadInput that
# names the argument, not an AttributeError from deep inside.


def _check_config_argument(cfg, overrides) -> None:
    """A run is a recipe name with overrides, or a resolved Config without them."""
    if not isinstance(cfg, (str, Config)):
        raise BadInput(f"cfg must be a Config (rj.load_config) or a recipe name, not {_described(cfg)}")
    if isinstance(cfg, Config) and overrides:
        raise BadInput("give overrides with a recipe name; a Config is already resolved (use load_config)")


def _described(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, str) and not value:
        return "an empty string"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _path_argument(value, name: str, expects: str) -> Path:
    if isinstance(value, (str, os.PathLike)) and str(value):
        return Path(value)
    raise BadInput(f"{name} must be {expects} (a str or path), not {_described(value)}")


def _int_argument(value, name: str) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    raise BadInput(f"{name} must be an integer, not {_described(value)}")


def _bool_argument(value, name: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise BadInput(f"{name} must be True or False, not {_described(value)}")


# ------------------------------------------------------------------ metrics


class Metrics(list):
    """The records of a run's ``metrics.jsonl``: a list of dicts (one per logged step,
    each with ``step``) that can also be read by column.

    ``m.column("eval/return")`` gives ``(steps, values)`` numpy arrays over the records
    that hold the key; ``m.last("eval/return")`` its newest value; ``m.plot(keys...)``
    draws them against the step with matplotlib.
    """

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self:
            seen.update(dict.fromkeys(r))
        return [k for k in seen if k != "step"]

    def column(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        rows = [r for r in self if key in r]
        if not rows and key not in self.keys():
            raise KeyError(f"no metric {key!r} in this run; it logged {', '.join(sorted(self.keys())) or 'nothing'}")
        steps = np.array([r["step"] for r in rows], np.int64)
        return steps, np.array([r[key] for r in rows], np.float64)

    def last(self, key: str, default=None):
        for r in reversed(self):
            if key in r:
                return r[key]
        return default

    def plot(self, *keys: str, x: str = "step", ax=None, title: str | None = None):
        """One line per key (default ``eval/return``) against ``x`` (the iteration, or another
        metric logged with them such as ``env/steps``) on ``ax`` (a new figure without one);
        a run of seeds side by side draws the mean with its 95% interval as a band; returns
        the axes."""
        import matplotlib.pyplot as plt

        from rlinf_jax.runtime.metrics import CI, SEED

        if ax is None:
            # Laid out when drawn, so the axis labels stay inside the figure a savefig writes.
            _, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
        for key in keys or ("eval/return",):
            self.column(key)  # a key the run never logged is named, not drawn empty
            rows = [r for r in self if key in r and x in r]
            xs, ys = [r[x] for r in rows], [r[key] for r in rows]
            line, = ax.plot(xs, ys, marker="o" if len(rows) < 30 else None, label=key)
            band = [r for r in rows if key + CI in r]
            if band:  # seeds side by side: the mean's 95% interval as a band
                lo = [r[key] - r[key + CI] for r in band]
                hi = [r[key] + r[key + CI] for r in band]
                runs = sum(1 for k in band[-1] if k.startswith(key + SEED))
                ax.fill_between([r[x] for r in band], lo, hi, color=line.get_color(), alpha=0.2,
                                label=f"95% interval ({runs} seeds)")
        ax.set_xlabel("iteration" if x == "step" else x)
        ax.grid(alpha=0.3)
        ax.legend()
        if title:
            ax.set_title(title)
        return ax


def read_metrics(run) -> Metrics:
    """The metrics of a run folder (or its ``metrics.jsonl``), as `Metrics`."""
    from rlinf_jax.runtime.metrics import read_metrics as records

    return Metrics(records(_path_argument(run, "run", "a run folder or its metrics.jsonl")))


# ------------------------------------------------------------------ train


@dataclass
class TrainResult:
    """What `train` returns: the run folder, the task's summary, every logged record, and
    the newest value of each metric (``final``)."""

    config: Config
    run_dir: Path
    summary: Any  # the task's summary (what the CLI prints as `text()`)
    metrics: Metrics
    final: dict = field(default_factory=dict)

    def restore(self, overrides=()):
        """The trained policy (see `restore`)."""
        return restore(self.run_dir, overrides)

    def __repr__(self) -> str:
        headline = {k: v for k, v in self.final.items() if k.startswith("eval/")}
        return f"TrainResult(run_dir={str(self.run_dir)!r}, steps={self.final.get('step')}, {headline})"


def train(cfg: Config | str, overrides: Sequence[str] | dict = (), console=None) -> TrainResult:
    """Trains (or, with ``runner.resume``, continues) the run ``cfg`` describes, as
    ``python -m rlinf_jax.train`` does; ``cfg`` may also be a recipe name, with
    ``overrides``. Progress shows as a bar (in Jupyter as a live cell output) unless
    ``runner.progress_bar=false``. Divergence raises `TrainingDiverged`, Ctrl-C
    `KeyboardInterrupt`; the last good checkpoint stays in the run folder either way."""
    from rich.console import Console

    from rlinf_jax.tasks.registry import task_of

    _check_config_argument(cfg, overrides)
    if isinstance(cfg, str):
        cfg = load_config(cfg, overrides)
    else:
        from rlinf_jax.runtime.xla_flags import apply_xla_cpu_flags

        apply_xla_cpu_flags(cfg.runner.xla_cpu_flags)
    summary = task_of(cfg).run(cfg, console=console if console is not None else Console())
    run_dir = Path(summary.run_dir)
    metrics = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else Metrics()
    final: dict = {}
    for record in metrics:
        final.update(record)
    return TrainResult(cfg, run_dir, summary, metrics, final)


# ------------------------------------------------------------------ evaluate


def _saved_config(path: Path, overrides) -> Config | None:
    """The config of the run a checkpoint path belongs to, or None for a model directory."""
    if path.is_dir() and (path / "config.json").is_file():
        return None
    from rlinf_jax.tasks.saved import run_config

    return run_config(path, overrides)[1]


def _is_lm(cfg: Config) -> bool:
    return cfg.runner.task in LM_TASKS and cfg.actor.model.kind != "vla"


def evaluate(path, overrides: Sequence[str] | dict = (), seed: int | None = None, strip=None,
             strip_episodes: int = 4, **lm_options) -> dict:
    """The evaluation of a saved run (its run folder, checkpoints folder or one step).

    Control and VLA runs: the greedy policy's ``eval/*`` metrics over the run's
    ``env.num_eval_envs`` episodes, by default those of the run's own evaluation at that
    step (the numbers it logged there; ``seed`` draws others); with ``strip`` (a new PNG
    path) and an env with camera images, the first ``strip_episodes`` episodes drawn as one
    image (its path under ``"strip"``). Language-model runs (sft, reasoning) and Hugging Face /
    converted model directories: pass@k on the run's held-out split or ``data=PATH``
    (``lm_options``: ``data``, ``ks``, ``n``, ``temperature``, ``out``, ``progress``),
    as ``python -m rlinf_jax.evaluate --checkpoint`` does.
    """
    path = _path_argument(path, "path", "a run folder, a checkpoint or a model directory")
    seed = None if seed is None else _int_argument(seed, "seed")
    strip_episodes = _int_argument(strip_episodes, "strip_episodes")
    if strip is not None:
        _path_argument(strip, "strip", "a new PNG file")
    if not path.exists():
        raise BadInput(f"{path}: no such path; give a run folder, a checkpoint or a model directory")
    overrides = _override_list(overrides)
    prepare_jax(None, overrides)
    cfg = _saved_config(path, overrides)
    if cfg is None or _is_lm(cfg):
        if strip is not None:
            raise BadInput("strip draws episodes of an env with camera images; a language model has none")
        from rlinf_jax.tasks.reasoning.evaluate import evaluate_lm

        return evaluate_lm(path, overrides=overrides, seed=seed or 0, **lm_options)
    if lm_options:
        raise BadInput(
            f"{', '.join(sorted(lm_options))}: options of language-model evaluation; {path} is a {cfg.runner.task} run"
        )
    from rlinf_jax.tasks.saved import evaluate_run

    return evaluate_run(path, overrides, seed, strip, strip_episodes)


# ------------------------------------------------------------------ convert


def convert(src, out, dtype: str = "auto", allow_nonfinite: bool = False) -> dict:
    """A local Hugging Face model directory (``config.json`` + safetensors) -> a Flax (Orbax)
    directory that ``actor.model.path`` takes, as ``python -m rlinf_jax.convert`` does;
    ``out`` must be new or empty. Every tensor is checked against the architecture, the
    result is read back, and what was written is returned: ``from``, ``to``,
    ``model_type``, ``params`` (a count) and ``dtype``. Weights holding NaN or inf are
    refused unless ``allow_nonfinite``."""
    _path_argument(src, "src", "a Hugging Face model directory")
    _path_argument(out, "out", "a new or empty directory")
    if not isinstance(dtype, str):
        raise BadInput(f"dtype must be a dtype name such as 'auto' or 'bfloat16', not {_described(dtype)}")
    allow_nonfinite = _bool_argument(allow_nonfinite, "allow_nonfinite")
    import contextlib

    import jax
    from flax import nnx

    from rlinf_jax.policies.convert import convert as convert_dir
    from rlinf_jax.policies.convert import load_converted, model_type_of
    from rlinf_jax.policies.lm.hf_checkpoint import nonfinite_weights_allowed

    with nonfinite_weights_allowed() if allow_nonfinite else contextlib.nullcontext():
        written = convert_dir(str(src), str(out), dtype=dtype)
    model = load_converted(written)
    params = jax.tree.leaves(nnx.state(model, nnx.Param))
    return {
        "from": str(src),
        "to": str(written),
        "model_type": model_type_of(written),
        "params": int(sum(p.size for p in params)),
        "dtype": str(params[0].dtype),
    }


# ------------------------------------------------------------------ plan


def plan(cfg: Config | str, target: str, overrides: Sequence[str] | dict = (), progress=None,
         remedies: bool = False, hbm_gib: float | None = None):
    """The run ``cfg`` (a Config, or a recipe name with ``overrides``) on paper for a TPU
    ``target`` such as ``"v5e:4x4"``, as ``python -m rlinf_jax.plan`` prints it: every
    program of an iteration compiled by the target's own compiler, the memory each chip
    holds, the predicted time and whether it fits (`rlinf_jax.flow.plan.PlanReport`:
    ``.fits``, ``.verdict()``, ``.table()``, ``.to_json()``). No weights are read and no
    TPU is needed; libtpu is (the ``tpu`` extra). ``progress`` is called with a line
    before each compile. With ``remedies``, a run that does not fit is planned again with
    each of its task's memory remedies, and with all of them: ``.remedies`` says which
    bring it under the line, and by how much (each is a full plan: minutes at real sizes).
    ``cluster.component_placement=auto`` plans every layout (collocated, disaggregated,
    hybrid), sets aside those that do not fit and keeps the fastest predicted. ``hbm_gib``
    plans against that much memory per chip instead of the chip's own."""
    import copy

    from rlinf_jax.flow.plan import plan_cache, plan_programs
    from rlinf_jax.sharding.targets import GIB, abstract_devices, parse_target
    from rlinf_jax.tasks.registry import task_of

    if not isinstance(target, str):
        raise BadInput(f"target must be a TPU topology such as 'v5e:4x4', not {type(target).__name__} {target!r}")
    chosen = parse_target(target)
    if hbm_gib is not None:
        chosen = chosen.with_memory(hbm_gib)
    _check_config_argument(cfg, overrides)
    if isinstance(cfg, str):
        cfg = load_config(cfg, overrides)
    devices = abstract_devices(chosen)
    task = task_of(cfg)

    def run(c: Config):
        programs, residents, notes = task.plan(c, devices)
        return plan_programs(chosen, programs, residents, notes, progress,
                             analyses=plan_cache(c.runner.compilation_cache, chosen))

    if cfg.cluster.component_placement == "auto":
        cfg, report = _auto_layout(cfg, run, progress)
    else:
        report = run(cfg)
    if remedies and not report.fits:
        candidates = task.remedies(cfg)
        together = {k: v for _, keys in candidates for k, v in keys.items()}
        if len(candidates) > 1:
            candidates = [*candidates, ("all of the above together", together)]
        for what, keys in candidates:
            if progress is not None:
                progress(f"planning again with {what}")
            changed = copy.deepcopy(cfg)
            for key, value in keys.items():
                _set_key(changed, key, value)
            task.check(changed)
            tried = run(changed)
            report.remedies.append({
                "remedy": what,
                "keys": keys,
                "fits": tried.fits,
                "peak_per_chip_gib": round(max(r.peak_bytes for r in tried.reports) / GIB, 4),
                "saves_gib": round((max(r.peak_bytes for r in report.reports) - max(r.peak_bytes for r in tried.reports))
                                   / GIB, 4),
                "predicted_iteration_s": tried.predicted_iteration_s,
                "effect": tried.verdict(),
            })
    return report


def _auto_layout(cfg: Config, run, progress):
    """``cluster.component_placement=auto`` on paper: every preset planned, those that do not
    fit set aside, the fastest predicted of the rest kept (the smallest peak when none fits).
    Returns the chosen config and its report, which says what was compared."""
    import copy

    from rlinf_jax.sharding.targets import GIB

    tried = []
    # Each preset, and disaggregated once more with the update borrowing the idle chips
    # (cluster.scaling=dynamic): the same programs, the update's on more chips, plus the moves.
    for mode, placement, scaling in (("collocated", "collocated", "static"),
                                     ("disaggregated", "disaggregated", "static"),
                                     ("disaggregated-dynamic", "disaggregated", "dynamic"),
                                     ("hybrid", "hybrid", "static")):
        if progress is not None:
            progress(f"auto placement: planning {mode}")
        c = copy.deepcopy(cfg)
        c.cluster.component_placement, c.cluster.scaling = placement, scaling
        try:
            tried.append((mode, c, run(c)))
        except BadInput as e:  # a layout these chips cannot hold (too few for the split)
            tried.append((mode, c, str(e)))
    plans = [(m, c, r) for m, c, r in tried if not isinstance(r, str)]
    if not plans:
        raise BadInput(f"cluster.component_placement=auto: no layout can be planned here ({tried[0][2]})")
    # Of the layouts that fit, the fastest predicted (moves between meshes on a chip whose
    # interconnect bandwidth is unpublished have no prediction: they compete on memory only
    # when nothing else fits); else the smallest peak.
    fitting = [t for t in plans if t[2].fits]
    timed = [t for t in fitting if t[2].predicted_iteration_s is not None]
    peak = lambda t: max(r.peak_bytes for r in t[2].reports)  # noqa: E731
    mode, chosen, report = (min(timed, key=lambda t: t[2].predicted_iteration_s) if timed
                            else min(fitting or plans, key=peak))

    def said(r) -> str:
        if isinstance(r, str):
            return f"cannot be laid out ({r})"
        peak = max(x.peak_bytes for x in r.reports) / GIB
        when = "" if r.predicted_iteration_s is None else f", {r.predicted_iteration_s:.3f} s predicted"
        return f"{'fits' if r.fits else 'does not fit'} (peak {peak:.2f} GiB per chip{when})"

    report.notes.insert(0, "auto placement: " + "; ".join(f"{m} {said(r)}" for m, _, r in tried) + f"; chose {mode}")
    report.auto = {m: ({"error": r} if isinstance(r, str) else {
        "fits": r.fits, "peak_per_chip_gib": round(max(x.peak_bytes for x in r.reports) / GIB, 4),
        "predicted_iteration_s": r.predicted_iteration_s}) for m, _, r in tried}
    report.auto["chosen"] = mode
    return chosen, report


def _set_key(cfg: Config, key: str, value) -> None:
    """``cfg.<dotted key> = value`` (a remedy's setting)."""
    *parents, name = key.split(".")
    node = cfg
    for part in parents:
        node = getattr(node, part)
    if not hasattr(node, name):
        raise BadInput(f"{key} is not a config key")
    setattr(node, name, value)


# ------------------------------------------------------------------ restore


@dataclass
class LMSampler:
    """A language model of a saved run or a model directory, with its run's tokenizer and
    prompt template (a model directory: its own tokenizer and the ``math`` template, as
    ``python -m rlinf_jax.evaluate --checkpoint`` samples it): ``sampler(["What is 2+3?"])``
    returns the responses as text."""

    config: Config
    checkpoint: str
    model: Any
    tokenizer: Any
    _generate: Callable = field(repr=False)

    def __call__(self, prompts: Sequence[str] | str, max_new_tokens: int | None = None, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        return self._generate([prompts] if isinstance(prompts, str) else list(prompts), max_new_tokens,
                              temperature, seed)


def _lm_sampler(path: Path, overrides: Sequence[str]) -> LMSampler:
    import jax

    from rlinf_jax.data import run_tokenizer
    from rlinf_jax.rollout.lm_io import PromptEncoder, decode_responses, pad_id, stop_tokens
    from rlinf_jax.rollout.sampler import Sampler, SamplingParams
    from rlinf_jax.tasks.reasoning.evaluate import lm_settings

    # The settings and model `evaluate --checkpoint` samples, for a run and a model directory alike.
    cfg, load_model, _, source = lm_settings(path, overrides)
    model = load_model()
    tokenizer = run_tokenizer(cfg.data.tokenizer, model.config.vocab_size)
    encoder = PromptEncoder(cfg.data, tokenizer)
    sampler = Sampler(model, pad_id=pad_id(tokenizer))
    stops = stop_tokens(tokenizer)

    def generate(prompts, max_new_tokens, temperature, seed):
        if not prompts:
            return []
        n = cfg.rollout.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        ro = cfg.rollout
        sampling = SamplingParams(n, float(temperature), ro.top_p, ro.top_k, stops)
        ids, mask = encoder(prompts)
        out = sampler.generate(ids, mask, jax.random.PRNGKey(seed), sampling)
        return decode_responses(tokenizer, out.tokens, out.mask)

    return LMSampler(cfg, str(source), model, tokenizer, generate)


def restore(path, overrides: Sequence[str] | dict = ()):
    """The trained policy of a saved run (run folder, checkpoints folder or one step), or
    the model of a Hugging Face or converted model directory.

    Control and VLA runs: a `RestoredPolicy`, callable on a batch of observations
    (``policy(obs)`` is the evaluation action; ``policy.sample(obs, keys)`` draws one;
    ``policy.env`` / ``policy.eval_env`` are the run's envs). Language-model runs and
    model directories: an `LMSampler`, callable on prompts, returning responses as text.
    """
    path = _path_argument(path, "path", "a run folder, a checkpoint or a model directory")
    if not path.exists():
        raise BadInput(f"{path}: no such path; give a run folder, a checkpoint or a model directory")
    overrides = _override_list(overrides)
    cfg = _saved_config(path, overrides)
    if cfg is None or _is_lm(cfg):
        return _lm_sampler(path, overrides)
    from rlinf_jax.tasks.saved import restore_policy

    return restore_policy(path, overrides)

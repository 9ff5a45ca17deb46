"""The house's rules, read from the code's own imports (an `ast` walk, nothing imported):
imports only go down the floors, no package imports a sibling leaf, no module takes part in
an import cycle, and imports sit at the top of their module.

The floors, top to bottom (docs/architecture.md):

    launch, train / evaluate / convert / plan (run only) -> cli / collect / profile -> api -> tasks -> flow -> rollout
      -> envs, policies, runtime -> config -> agents -> algos, data, rewards, sharding, replay, kernels
      -> errors, crash, accelerators
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "rlinf_jax"

FLOORS = {
    "errors": 0,
    "crash": 0,
    "accelerators": 0,
    "array_types": 0,
    "algos": 1,
    "replay": 1,
    "kernels": 1,
    "data": 1,
    "rewards": 1,
    "sharding": 1,
    "agents": 2,
    "config": 3,
    "envs": 4,
    "policies": 4,
    "runtime": 4,
    "rollout": 5,
    "flow": 6,
    "tasks": 7,
    "api": 8,
    "cli": 9,
    "train": 10,  # only run (`python -m`): it runs cli.train
    "evaluate": 10,  # only run (`python -m`): it runs cli.evaluate
    "convert": 10,  # only run (`python -m`): it runs cli.convert
    "collect": 9,
    "profile": 9,
    "plan": 10,  # only run (`python -m`): it runs cli.plan
    "launch": 10,
}
# Sub-packages of tasks are workloads: one may build on another (sft on embodied for the
# VLA, reasoning on sft for its warm start), never in a circle.
SIBLINGS_ALLOWED = {"tasks"}
# Command-line entry points may defer their imports so that `--help` answers before JAX loads.
DEFERRING_ENTRY_POINTS = {"api", "cli", "train", "evaluate", "convert", "collect", "profile", "launch", "plan"}
# The task registry imports a task's run on its first call: checking a config, or running
# a language model, must not pay for the simulators' imports (MuJoCo's MJX, Brax: seconds).
DEFERRING_MODULES = {"rlinf_jax.tasks.registry"}
# Third-party packages that may be imported inside a function: optional, or heavy and
# needed on one path only (each such import carries a comment saying which).
OPTIONAL = {
    "brax", "mujoco_playground", "torch", "transformers", "ray", "reasoning_gym", "math_verify",
    "pyarrow", "tensorboardX", "safetensors", "rich", "gymnasium", "bm25s", "skyrl_gym", "robosuite",
    "libero", "yaml", "qwix",
    # A worker script's sibling, imported on its simulator's path only.
    "libero_task",
}
# Scripts run as worker processes under any interpreter (env.worker_python): the standard
# library, numpy and the simulator only; never JAX, never the package itself.
WORKER_SCRIPTS = {"rlinf_jax.envs.host.worker", "rlinf_jax.envs.host.libero_task"}
WORKER_IMPORTS = {"__future__", "json", "mmap", "os", "sys", "traceback", "numpy", "gymnasium", "robosuite",
                  "atexit", "functools", "importlib", "io", "pickle", "shutil", "tempfile", "zipfile", "yaml", "libero",
                  "libero_task"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(path: Path, name: str):
    """``(line, imported module, at module level)`` for every import in the file."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    # Imports under `if TYPE_CHECKING:` or `try:` at module level count as module level.
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try)):
            top_level |= {id(n) for n in ast.walk(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, id(node) in top_level
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                # `from pkg import sub` imports the module pkg.sub when there is one.
                target = f"{base}.{alias.name}"
                yield node.lineno, target if target in MODULES else base, id(node) in top_level


def _floor(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    if parts[0] != "rlinf_jax" or len(parts) < 2:
        return None
    return parts[1], FLOORS[parts[1]]


def _edges():
    for name, path in MODULES.items():
        for line, target, top in _imports(path, name):
            yield name, path, line, target, top


def test_every_package_has_a_floor():
    assert {n.split(".")[1] for n in MODULES if n != "rlinf_jax"} <= set(FLOORS)


def test_imports_only_go_down():
    bad = []
    for name, path, line, target, _ in _edges():
        src, dst = _floor(name) if name != "rlinf_jax" else None, _floor(target)
        if src is None or dst is None or src[0] == dst[0]:
            continue
        if dst[1] > src[1] or (dst[1] == src[1] and src[0] not in SIBLINGS_ALLOWED):
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({src[0]}, floor {src[1]}) imports {target} (floor {dst[1]})")
    assert not bad, "imports that run up or sideways:\n" + "\n".join(bad)


def test_no_import_cycles():
    graph: dict[str, set[str]] = {n: set() for n in MODULES}
    for name, _, _, target, top in _edges():
        if top and target in MODULES and target != name:
            graph[name].add(target)
    # Tarjan's strongly connected components: any component of two or more is a cycle.
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_sit_at_the_top_of_their_module():
    bad = []
    for name, path, line, target, top in _edges():
        if top:
            continue
        root = target.split(".")[0]
        if name.split(".")[1] in DEFERRING_ENTRY_POINTS or name in DEFERRING_MODULES or root in OPTIONAL:
            continue
        bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} inside a function")
    assert not bad, "function-local imports:\n" + "\n".join(bad)


def test_worker_scripts_import_no_jax_and_nothing_of_the_package():
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for name, path, line, target, _ in _edges()
        if name in WORKER_SCRIPTS and target.split(".")[0] not in WORKER_IMPORTS
    ]
    assert not bad, "a worker script must run without JAX and without rlinf_jax:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", ["flow"])
def test_the_engine_knows_no_workload(package):
    """flow/ is the engine: it names no env, policy, algorithm or task."""
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for name, path, line, target, _ in _edges()
        if name.startswith(f"rlinf_jax.{package}")
        and target.split(".")[1:2] in (["envs"], ["policies"], ["algos"], ["tasks"], ["rewards"], ["data"], ["agents"])
    ]
    assert not bad, "\n".join(bad)


def test_no_trainer_is_patched_after_construction():
    """A trainer gets everything its loop reads in its constructor (`flow.trainer`'s
    contract): no module assigns an attribute of another object named ``trainer``."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for t in ast.walk(target):
                    owner = t.value if isinstance(t, ast.Attribute) else None
                    while isinstance(owner, ast.Attribute):
                        owner = owner.value
                    if isinstance(owner, ast.Name) and owner.id == "trainer" or (
                            isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute)
                            and t.value.attr == "trainer"):
                        found.append(f"{name}:{node.lineno}")
    assert not found, found


def test_the_env_stepping_tasks_share_a_floor_and_not_each_other():
    """Embodied PPO and the off-policy family build on `tasks.env_rl`, never on each other."""
    edges = {(src, dst) for src, _path, _line, dst, _top in _edges()}
    for a, b in (("embodied", "offpolicy"), ("offpolicy", "embodied")):
        assert not any(src.startswith(f"rlinf_jax.tasks.{a}") and dst.startswith(f"rlinf_jax.tasks.{b}")
                       for src, dst in edges), (a, b)
    assert any(src.startswith("rlinf_jax.tasks.offpolicy") and dst.startswith("rlinf_jax.tasks.env_rl")
               for src, dst in edges)

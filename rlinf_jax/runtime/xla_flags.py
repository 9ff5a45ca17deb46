"""The XLA CPU flags a run starts JAX with (``runner.xla_cpu_flags``).

XLA reads ``XLA_FLAGS`` once, when JAX starts its first backend, so the flags must be in
the environment before anything builds an array; the command modules and the API apply
them right after reading the config and before importing the tasks (whose imports start
the backend). A process whose backend is already running keeps the flags it started with,
and the run says so in one warning line.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import sys

# The value of `runner.xla_cpu_flags` that means "the project's defaults for this machine".
DEFAULT = "default"

# The project's CPU defaults, chosen by benchmarks/xla_cpu_flags.py on the project's own
# programs (PPO and SAC chunks, the LM train step and sampler); see benchmarks/README.md.
# None yet: no candidate (the YNNPACK, XNNPACK and oneDNN dot fusions) made those programs
# measurably faster on the 2-core CPU they were measured on, and YNNPACK's dots change PPO's
# and SAC's metrics within a few iterations.
CPU_DEFAULT_FLAGS = ""

# Distributions whose presence makes JAX's default platform an accelerator.
_ACCELERATOR_PLUGINS = ("jax-cuda", "jax_cuda", "libtpu", "jax-rocm", "jax_rocm", "jax-tpu", "jax_tpu")

_warned = False


def resolve(setting: str) -> str:
    """The flags ``runner.xla_cpu_flags`` stands for: ``default`` the project's, ``""``
    none, anything else itself."""
    setting = (setting or "").strip()
    return CPU_DEFAULT_FLAGS if setting == DEFAULT else setting


def _flag_name(flag: str) -> str:
    return flag.lstrip("-").split("=", 1)[0]


def _platform_is_cpu(environ) -> bool:
    """Whether JAX will run on the CPU, decided without starting a backend: ``JAX_PLATFORMS``
    when set, otherwise no accelerator plugin installed."""
    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    try:
        names = {(d.metadata["Name"] or "").lower() for d in importlib.metadata.distributions()}
    except Exception:  # a broken installed distribution must not stop a run
        return True
    return not any(n.startswith(_ACCELERATOR_PLUGINS) for n in names)


def merged_flags(setting: str, current: str) -> str:
    """``current`` (the environment's XLA_FLAGS) with the flags of ``setting`` added, each
    one only when ``current`` does not already set a flag of the same name: a flag the user
    put in XLA_FLAGS wins."""
    have = {_flag_name(f) for f in shlex.split(current)}
    extra = [f for f in shlex.split(resolve(setting)) if _flag_name(f) not in have]
    return " ".join([current.strip(), *extra]).strip()


def _backend_started() -> bool:
    # Looked up, not imported: a process that has not imported JAX has not started it.
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(xla_bridge, "_backends", None))


def apply_xla_cpu_flags(setting: str, environ=None) -> str | None:
    """Puts ``runner.xla_cpu_flags`` into ``XLA_FLAGS`` when JAX will run on the CPU and
    its backend has not started. Returns the XLA_FLAGS set, or None when nothing changed."""
    global _warned
    environ = os.environ if environ is None else environ
    if not resolve(setting) or not _platform_is_cpu(environ):
        return None
    current = environ.get("XLA_FLAGS", "")
    flags = merged_flags(setting, current)
    if flags == current.strip():
        return None
    if _backend_started():
        if not _warned:
            _warned = True
            print(
                f"warning: runner.xla_cpu_flags ({resolve(setting)}) not applied: JAX's backend started before "
                f"the run did (restart the process, or set XLA_FLAGS before the first JAX computation)",
                file=sys.stderr,
            )
        return None
    environ["XLA_FLAGS"] = flags
    return flags

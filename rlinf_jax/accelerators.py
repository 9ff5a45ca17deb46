"""Which accelerators this machine has, read from the operating system without starting JAX,
and the one platform choice that follows from it.

With ``libtpu`` installed (the ``tpu`` extra, which `python -m rlinf_jax.plan` needs to
compile for TPU targets), JAX tries the TPU backend first on every start. On a machine
without TPU chips that try fails, and libtpu prints half a dozen lines about TPU host
bounds and worker hostnames before JAX falls back to the CPU. So when libtpu is installed
and the machine has neither TPU chips nor GPUs, importing the package sets
``JAX_PLATFORMS=cpu`` (unless the user set it): a run starts as quietly as without libtpu,
and the planner still compiles for TPUs, since abstract TPU topologies need libtpu, not
a TPU backend. On a TPU or GPU machine nothing is changed.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import sys

GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips' PCI vendor id (v5e/v5p/v6e show as vfio devices)


def tpu_chips_present() -> bool:
    """Whether this machine has TPU chips (accel devices, or Google's PCI vendor id)."""
    if glob.glob("/dev/accel[0-9]*"):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == GOOGLE_PCI_VENDOR:
                    return True
        except OSError:
            continue
    return False


def gpus_present() -> bool:
    """Whether this machine has NVIDIA or AMD GPUs."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/kfd")


def libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def quiet_cpu_default(environ=None) -> bool:
    """Sets ``JAX_PLATFORMS=cpu`` where libtpu is installed but nothing could use it (see the
    module's docstring); returns whether it did. A JAX already imported gets the same
    setting through its config, which it reads when its first backend starts."""
    env = os.environ if environ is None else environ
    if env.get("JAX_PLATFORMS") or not libtpu_installed() or tpu_chips_present() or gpus_present():
        return False
    env["JAX_PLATFORMS"] = "cpu"
    jax = sys.modules.get("jax")
    if environ is None and jax is not None and hasattr(jax, "config"):
        jax.config.update("jax_platforms", "cpu")
    return True


# A GPU target of the planner (``h100x8``): GPUs it stands in for with XLA's host devices,
# whose count must be set before JAX starts (`rlinf_jax.sharding.targets`).
GPU_TARGET = re.compile(r"^(a100|h100|h200)[x:](\d+)$")


def host_devices_for_target(text: str) -> None:
    """Before JAX starts: as many host devices as the GPU target ``text`` names GPUs (a TPU
    target needs none). A count the user already set in ``XLA_FLAGS`` is kept."""
    m = GPU_TARGET.match(str(text).strip().lower())
    flags = os.environ.get("XLA_FLAGS", "")
    if m and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(m.group(2))}".strip()

"""Hardware a run can be planned for without having it: TPU topologies as abstract devices that
XLA's real TPU compiler accepts, and each chip's published limits.

``v5e:4x4`` names a TPU generation and its chip grid (``v5p:2x2x2``, ``v6e:2x4``, ``v4:2x2x2``,
``v5e:16x16`` ...). `abstract_devices` asks libtpu (the ``tpu`` extra) for the topology:
devices that a `jax.sharding.Mesh` can hold and that `jax.jit(f).lower(...).compile()`
compiles for, on a machine with no TPU at all. Each host of a TPU slice holds the chips of
``chips_per_host`` (four of them in a 2x2 block on every generation here; eight on one-host
v5e/v6e slices of eight), so a topology of more chips is several hosts' worth.

``h100x8`` names GPUs and how many (``a100x8``, ``h200x16``; eight to a host). No library
offers abstract GPUs, so a GPU target is an estimate: the programs are laid out on as many
of XLA's host (CPU) devices and compiled by its CPU compiler, whose memory and cost analyses
stand in for the GPU compiler's (other fusions, other layouts, no GPU kernels); the plan
says so in its notes. The command sets the host device count itself; from Python, start
the process with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``.

The limits (`Chip`) are the vendors' published figures per chip: HBM, peak dense bfloat16
FLOP/s and HBM bandwidth. They bound a prediction, they do not measure anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import re
import tempfile
from dataclasses import dataclass

import jax
from jax.experimental import topologies

from rlinf_jax.accelerators import GPU_TARGET, tpu_chips_present
from rlinf_jax.errors import BadInput

GIB = 1024**3


@dataclass(frozen=True)
class Chip:
    name: str
    hbm_gib: float  # memory per chip
    peak_flops: float  # dense bfloat16 FLOP/s per chip
    hbm_bytes_per_s: float
    platform: str = "tpu"
    # Chip-to-chip bandwidth, both directions together (TPU ICI, NVLink); 0 where no figure
    # is published. What moving state between meshes (cluster.scaling=dynamic) is held to.
    ici_bytes_per_s: float = 0.0


# Published per-chip figures (Google Cloud's TPU system architecture pages; NVIDIA's H100
# SXM datasheet, dense bfloat16 without sparsity). The v4 page gives no per-chip ICI figure.
CHIPS = {
    "v4": Chip("v4", 32.0, 275e12, 1.2e12),
    "v5e": Chip("v5e", 16.0, 197e12, 0.819e12, ici_bytes_per_s=400e9),
    "v5p": Chip("v5p", 95.0, 459e12, 2.765e12, ici_bytes_per_s=1200e9),
    "v6e": Chip("v6e", 32.0, 918e12, 1.64e12, ici_bytes_per_s=800e9),
}
GPUS = {
    "a100": Chip("a100", 80.0, 312e12, 2.039e12, "gpu", 600e9),  # A100 SXM 80 GB, NVLink 3
    "h100": Chip("h100", 80.0, 989e12, 3.35e12, "gpu", 900e9),  # H100 SXM, NVLink 4
    "h200": Chip("h200", 141.0, 989e12, 4.8e12, "gpu", 900e9),
}
GPUS_PER_HOST = 8
GPU_ESTIMATE_NOTE = (
    "estimate: no abstract GPUs exist, so XLA's CPU compiler on {n} host devices compiled these programs; its "
    "memory and FLOPs stand in for the GPU compiler's (other fusions and layouts: expect the temporaries to differ)"
)


@dataclass(frozen=True)
class Target:
    """A topology to plan for: ``chip`` and its grid (``dims``, 2 or 3 numbers)."""

    chip: Chip
    dims: tuple[int, ...]
    text: str

    @property
    def chips(self) -> int:
        return math.prod(self.dims)

    def with_memory(self, hbm_gib: float) -> Target:
        """The same chips planned against ``hbm_gib`` of memory each (what other tenants of
        the chips leave, or a safety margin of your own)."""
        if not hbm_gib > 0:
            raise BadInput(f"--hbm-gib={hbm_gib} must be > 0")
        return dataclasses.replace(self, chip=dataclasses.replace(self.chip, hbm_gib=float(hbm_gib)))

    @property
    def chips_per_host(self) -> tuple[int, int, int]:
        if self.chip.platform == "gpu":
            return (min(self.chips, GPUS_PER_HOST), 1, 1)
        if self.chips == 8 and self.chip.name in ("v5e", "v6e") and len(self.dims) == 2:
            return (2, 4, 1)  # v5e-8 / v6e-8: one host of eight chips
        return (min(2, self.dims[0]), min(2, self.dims[1]), 1)

    @property
    def hosts(self) -> int:
        return max(1, self.chips // math.prod(self.chips_per_host))

    @property
    def chip_config(self) -> str:
        # v4 and v5p chips hold two TensorCores that JAX runs as one device (megacore); v4's
        # default configuration would list each core as a device of half the chip's memory.
        return "megacore" if self.chip.name == "v4" else "default"

    @property
    def topology_name(self) -> str:
        return f"{self.chip.name}:{'x'.join(map(str, self.dims))}"


_TARGET = re.compile(r"^(v4|v5e|v5p|v6e)[:\-]((?:\d+x)+\d+)$")


def parse_target(text: str) -> Target:
    """``v5e:4x4`` or ``h100x8`` -> its `Target`; one `BadInput` line for anything else."""
    g = GPU_TARGET.match(str(text).strip().lower())
    if g:
        n = int(g.group(2))
        if n < 1:
            raise BadInput(f"--target {text!r}: the number of GPUs must be >= 1")
        return Target(GPUS[g.group(1)], (n,), str(text).strip())
    m = _TARGET.match(str(text).strip().lower())
    if not m:
        known = ", ".join(f"{c}:2x2" for c in CHIPS)
        raise BadInput(
            f"--target {text!r} is not a TPU topology or a GPU count; give a TPU generation and its chip grid, such "
            f"as {known}, v5e:4x4 or v5p:2x2x2, or GPUs as h100x8 ({', '.join(GPUS)})"
        )
    chip = CHIPS[m.group(1)]
    dims = tuple(int(d) for d in m.group(2).split("x"))
    if any(d < 1 for d in dims):
        raise BadInput(f"--target {text!r}: every dimension of the chip grid must be >= 1")
    three_d = chip.name in ("v4", "v5p")
    if three_d != (len(dims) == 3):
        shape = "three numbers (e.g. 2x2x2)" if three_d else "two numbers (e.g. 2x4)"
        raise BadInput(f"--target {text!r}: a {chip.name} slice is a grid of {shape}")
    return Target(chip, dims, str(text).strip())


@contextlib.contextmanager
def _libtpu_quiet():
    """libtpu writes a few lines about TPU host bounds and worker hostnames to file
    descriptor 2 when it starts on a machine without TPUs: held back while it starts."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def gpu_stand_ins(target: Target) -> list:
    """XLA's host devices standing in for a GPU target's GPUs (see the module docstring)."""
    cpus = jax.devices("cpu")
    if len(cpus) < target.chips:
        raise BadInput(
            f"planning for {target.text} lays its programs out on {target.chips} host devices standing in for the "
            f"GPUs; this process has {len(cpus)}: start it with XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{target.chips} (python -m rlinf_jax.plan does so itself)"
        )
    return cpus[: target.chips]


def abstract_devices(target: Target) -> list:
    """The target's chips as devices XLA's TPU compiler lays programs out on (needs libtpu,
    not a TPU); one `BadInput` line naming the install command without it. For a GPU
    target, host devices in their place (`gpu_stand_ins`)."""
    if target.chip.platform == "gpu":
        return gpu_stand_ins(target)
    if importlib.util.find_spec("libtpu") is None:
        raise BadInput(
            f"planning for {target.text} needs libtpu, the TPU compiler; install it with "
            "pip install -e \".[tpu]\" (it needs no TPU)"
        )
    if not tpu_chips_present():
        # libtpu takes a machine-wide lock file on load, which only matters where chips
        # are; abstract topologies share nothing, so several planners (a test suite's
        # workers) may load it side by side.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with _libtpu_quiet():
        try:
            topology = topologies.get_topology_desc(
                platform="tpu", topology_name=target.topology_name, chip_config_name=target.chip_config,
                chips_per_host_bounds=target.chips_per_host, num_slices=1,
            )
        except Exception as e:  # libtpu refuses shapes it does not know in several ways
            raise BadInput(f"--target {target.text}: libtpu does not know this topology ({str(e).splitlines()[0]})") from None
    return list(topology.devices)

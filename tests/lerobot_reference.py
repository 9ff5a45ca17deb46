"""The kept lerobot references (``tests/data/*_lerobot``): their inputs and outputs, the
checkpoint through our converter registry, and the check that lerobot itself still writes
them, which runs only where ``tests/reference/lerobot_env.py`` has built its environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from rlinf_jax.policies import convert as registry

SCRIPTS = Path(__file__).parent / "reference"


def load_io(reference: Path) -> dict:
    return dict(np.load(reference / "io.npz"))


def converted(reference: Path, tmp: Path):
    """The reference checkpoint through the registry (as ``python -m rlinf_jax.convert`` runs it)."""
    return registry.load_converted(registry.convert(reference, tmp / "converted"))


def lerobot_python() -> str:
    """The reference environment's interpreter; skips the test where it is not built."""
    found = subprocess.run([sys.executable, str(SCRIPTS / "lerobot_env.py"), "--check"], capture_output=True,
                           text=True)
    if found.returncode != 0:
        pytest.skip("the lerobot reference environment is not built: python tests/reference/lerobot_env.py")
    return found.stdout.strip()


def check_rewritten(script: str, reference: Path, out: Path, io: dict, checkpoints=("model.safetensors",)) -> str:
    """Runs ``script`` with lerobot into ``out`` and checks it wrote what ``reference`` keeps:
    outputs within 1e-6, weights bit-equal. Returns the environment's interpreter."""
    python = lerobot_python()
    subprocess.run([python, str(SCRIPTS / script), str(out)], check=True, capture_output=True)
    fresh = load_io(out)
    assert sorted(fresh) == sorted(io)
    for key in io:
        np.testing.assert_allclose(fresh[key], io[key], atol=1e-6, err_msg=key)
    for name in checkpoints:
        kept, written = load_file(reference / name), load_file(out / name)
        assert sorted(kept) == sorted(written)
        assert all(np.array_equal(kept[k], written[k]) for k in kept), name
    return python

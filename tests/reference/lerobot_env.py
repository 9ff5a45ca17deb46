"""The reference environment for parity with lerobot's torch VLAs (pi0.5, GR00T-N1.5).

lerobot 0.4.4 pins ``torch<2.11`` and its pi0.5 needs openpi's patched transformers 4.53
(adaptive norms in Gemma), where we pin torch 2.13 and transformers 5: so it lives in a
virtual environment of its own, built from the registry on first use (about 8 GB: torch 2.10
with its CUDA libraries, which run on a CPU too):

    python tests/reference/lerobot_env.py          # builds if needed, prints its python
    python tests/reference/lerobot_env.py --check  # prints its python, or exits 1 if not built

openpi's patch is applied as openpi's instructions apply it: transformers 4.53.3 installed,
then the ``transformers-openpi`` wheel's files copied over it, so the distribution is still
named transformers (lerobot asks for it by that name) and ``transformers.models.siglip.check``
passes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path("~/.cache/rlinf_jax/lerobot-venv").expanduser()
REQUIREMENTS = ["lerobot==0.4.4", "torch==2.10.0", "torchvision==0.25.0", "transformers==4.53.3", "numpy<2.3",
                "safetensors",
                # lerobot's groot extra without its CUDA-only packages (flash-attn, decord), and the
                # diffusers its DiT is built from
                "peft>=0.13,<1", "dm-tree>=0.1.8,<1", "diffusers==0.35.2"]
OPENPI_PATCH = "transformers-openpi==4.53.3"  # openpi's transformers_replace files, as a wheel


def python(build: bool = True) -> str | None:
    """The environment's interpreter; built first when missing and ``build`` (None otherwise)."""
    interpreter = ROOT / "bin" / "python"
    ready = ROOT / "ready.txt"
    wanted = "\n".join([*REQUIREMENTS, OPENPI_PATCH]) + "\n"
    if ready.is_file() and interpreter.is_file() and ready.read_text() == wanted:
        return str(interpreter)
    if not build:
        return None
    fresh = not interpreter.is_file()
    ROOT.parent.mkdir(parents=True, exist_ok=True)
    log = ROOT.parent / "lerobot-venv-install.log"
    with open(log, "w") as out:
        def run(*args):
            subprocess.run([str(interpreter), "-m", "pip", "install", "-q", *args], check=True, stdout=out,
                           stderr=subprocess.STDOUT)

        if fresh:
            subprocess.run([sys.executable, "-m", "venv", str(ROOT)], check=True)
        # An environment built for older requirements gets what it lacks, and the patch again
        # (a reinstall of transformers would undo it).
        run(*REQUIREMENTS)
        run("--no-deps", "--force-reinstall", OPENPI_PATCH)
    ready.write_text(wanted)
    return str(interpreter)


def main() -> int:
    if "--check" in sys.argv[1:]:
        found = python(build=False)
        if found is None:
            print(f"the lerobot reference environment is not built ({ROOT}); build it with: "
                  f"python tests/reference/lerobot_env.py", file=sys.stderr)
            return 1
        print(found)
        return 0
    try:
        print(python())
    except subprocess.CalledProcessError:
        print(f"error: building {ROOT} failed; pip's output: {ROOT.parent / 'lerobot-venv-install.log'}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

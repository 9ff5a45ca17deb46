#!/usr/bin/env python
"""Env-steps/s of VLA fine-tuning (``ppo_vla_tabletop``: the tiny OpenVLA-OFT-shaped policy
on the rendered JAX tabletop) collocated vs disaggregated vs hybrid on the same devices.

The layouts and the timing are those of `placement_modes.py` (one child process per device
count, forced host devices on a CPU, the real ones on a GPU machine); only the workload
differs. Rendering and physics (env) and the VLA's forward pass (rollout) are both heavy
here, which is the case RLinf's pipelining is for.

The last line of stdout is one JSON object: per device count every mode's env-steps/s
(control sub-steps), each fixed layout's ratio to collocated, and ``ratio`` = the on-policy
disaggregated layout / collocated, the same algorithm in both (the smallest over the device
counts at top level); the stale layouts are labelled rows of their own.

    python benchmarks/vla_modes.py                      # 2 and 8 devices
    python benchmarks/vla_modes.py --devices 2 --iterations 4 env.num_envs=32
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from placement_modes import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["--workload", "vla", *sys.argv[1:]], name="vla_modes"))

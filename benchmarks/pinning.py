"""Pinning a benchmark process to one CPU core, before torch or JAX start their threads."""

from __future__ import annotations

import argparse
import os
import sys


def pin_to_one_cpu(argv) -> int:
    """Restricts this process, and every thread it starts later, to one CPU core: ``--cpu N``
    from ``argv``, by default the lowest-numbered core it may run on. Returns the core."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--cpu", type=int)
    allowed = sorted(os.sched_getaffinity(0))
    cpu = parser.parse_known_args(argv)[0].cpu
    cpu = allowed[0] if cpu is None else cpu
    if cpu not in allowed:
        print(f"error: --cpu {cpu} is not a core this process may use; pick one of {allowed}", file=sys.stderr)
        raise SystemExit(2)
    os.sched_setaffinity(0, {cpu})
    return cpu

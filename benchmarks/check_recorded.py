"""`python benchmarks/check_recorded.py [--only NAME ...] [--tolerance 0.15] [--list]`: reruns the
commands recorded for this machine's kind of CPU (`recorded.json`) and exits 1 when a figure
comes out more than the tolerance worse than recorded, or a command fails.

For maintainers, before a release or after a change to a hot path: it takes as long as the
recorded commands (minutes each), so it is not part of CI. Each command runs as recorded,
from the repository root; its stdout's JSON lines are its result. Exit codes: 0 every
figure holds, 1 a regression or a failed command, 2 bad input or nothing recorded for this
kind of CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import recorded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def result_of(stdout: str) -> dict:
    """The figures a command printed: its JSON object lines, merged in order (a recorded
    command may run a benchmark twice, e.g. once per algorithm)."""
    merged: dict = {}
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                merged.update(value)
    return merged


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/check_recorded.py", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these benchmarks only (names in recorded.json)")
    parser.add_argument("--tolerance", type=float, default=0.15, help="how much worse a figure may be (default 0.15)")
    parser.add_argument("--list", action="store_true", help="print what would run, and exit")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per command (default 3600)")
    args = parser.parse_args(argv)
    here, names = recorded.cpu(), list(recorded.book())
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        print(f"error: no recorded benchmark {', '.join(unknown)}; recorded: {', '.join(names)}", file=sys.stderr)
        return 2
    todo = [(n, e) for n in (args.only or names) for e in recorded.recorded(n) if recorded.same_kind(e.get("cpu", ""), here)]
    if not todo:
        print(f"error: nothing is recorded for this kind of CPU ({here}); record its figures in "
              "benchmarks/recorded.json first", file=sys.stderr)
        return 2
    failed = 0
    for i, (name, entry) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {name}: {entry['command']}", flush=True)
        if args.list:
            continue
        start = time.monotonic()
        try:
            proc = subprocess.run(entry["command"], shell=True, cwd=ROOT, capture_output=True, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"  failed: no result within {args.timeout:.0f} s", flush=True)
            failed += 1
            continue
        result = result_of(proc.stdout)
        if proc.returncode != 0 or not result:
            print(f"  failed: exit {proc.returncode}; {proc.stderr.strip().splitlines()[-1:] or 'no output'}", flush=True)
            failed += 1
            continue
        lines = recorded.regressions(name, result, tolerance=args.tolerance)
        figures = {k: result.get(k) for d in ("higher", "lower") for k in entry.get(d, {})}
        print(f"  {time.monotonic() - start:.0f} s: {figures} (recorded at {entry['commit']}: "
              f"{ {**entry.get('higher', {}), **entry.get('lower', {})} })", flush=True)
        for line in lines:
            print(f"  {line}", flush=True)
        failed += bool(lines)
    if not args.list:
        print(f"{len(todo) - failed} of {len(todo)} hold within {args.tolerance:.0%} on {here}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

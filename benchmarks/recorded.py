"""The figures benchmarks/README.md records (``recorded.json``) and the check every
benchmark runs on its result: one ``warning:`` line per figure more than ``TOLERANCE``
worse than recorded, naming the commit it was recorded at."""

from __future__ import annotations

import json
import os
import sys

TOLERANCE = 0.10
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recorded.json")


def recorded(name: str) -> dict:
    with open(PATH) as f:
        return json.load(f).get(name, {})


def regressions(name: str, result: dict, tolerance: float = TOLERANCE) -> list[str]:
    """The lines saying which of ``result``'s figures fall more than ``tolerance`` short
    of the recorded ones (figures the result lacks are skipped, and every figure when the
    result's settings differ from the recorded run's)."""
    entry = recorded(name)
    # Figures of other settings (a smaller batch, another env) are not comparable.
    settings = {**result.get("settings", {}), **result}  # settings may sit at the top or under "settings"
    if any(settings.get(k) != v for k, v in entry.get("settings", {}).items()):
        return []
    lines = []
    for direction, sign in (("higher", 1.0), ("lower", -1.0)):
        for key, ref in entry.get(direction, {}).items():
            got = result.get(key)
            if not isinstance(got, (int, float)) or not ref:
                continue
            worse = sign * (ref - got) / ref  # > 0: worse than recorded
            if worse > tolerance:
                lines.append(
                    f"warning: {name}: {key} {got:g} is {worse:.0%} worse than the recorded {ref:g} "
                    f"(commit {entry.get('commit', '?')}, `{entry.get('command', '')}`); the code or the machine's "
                    f"load has changed since"
                )
    return lines


def warn_regressions(name: str, result: dict) -> None:
    """Prints :func:`regressions` to stderr (stdout's last line stays the JSON result)."""
    for line in regressions(name, result):
        print(line, file=sys.stderr, flush=True)

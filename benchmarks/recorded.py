"""The figures benchmarks/README.md records (``recorded.json``) and the check every
benchmark runs on its result: one ``warning:`` line per figure more than ``TOLERANCE``
worse than recorded, naming the commit it was recorded at.

An entry names the CPU it was measured on (``cpu``: vendor, model and the features the
figures depend on: AVX-512, its bfloat16 instructions, AMX tiles). On another CPU the
figures are not compared, and one ``note:`` line says so instead: a figure measured with
AMX's bfloat16 products says nothing about a CPU without them."""

from __future__ import annotations

import json
import os
import platform
import sys

TOLERANCE = 0.10
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recorded.json")


# The CPU features a recorded figure can depend on, as /proc/cpuinfo names them.
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu(cpuinfo: str | None = None) -> str:
    """This machine's CPU in one line, e.g. ``AuthenticAMD AMD EPYC | avx2``."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:  # not Linux: what the platform module knows
            return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    name = " ".join(x for x in (fields.get("vendor_id"), fields.get("model name")) if x)
    return f"{name or platform.machine()} | {' '.join(f for f in FEATURES if f in flags) or 'none of ' + '/'.join(FEATURES)}"


def same_kind(a: str, b: str) -> bool:
    """Whether two :func:`cpu` lines name CPUs of one vendor with the same features (the
    model name is left out: a virtual machine may not report it)."""
    key = lambda line: (line.split()[0] if line.split() else "", line.rpartition("|")[2].split())  # noqa: E731
    return key(a) == key(b)


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
    here = cpu()
    if entry.get("cpu") and not same_kind(entry["cpu"], here):
        return [
            f"note: {name}: the recorded figures (commit {entry.get('commit', '?')}) were measured on "
            f"{entry['cpu']}; this machine is {here}, so they are not compared"
        ]
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

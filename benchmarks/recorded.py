"""The figures benchmarks/README.md records (``recorded.json``) and the check every
benchmark runs on its result: one ``warning:`` line per figure more than ``TOLERANCE``
worse than recorded, naming the commit it was recorded at.

A benchmark has one entry per kind of CPU it was recorded on. An entry names the CPU
(``cpu``: vendor, model and the features the figures depend on: AVX-512, its bfloat16
instructions, AMX tiles); a result is compared with the entry of its own kind of CPU only.
Without one, a ``note:`` line says so instead: a figure measured with AMX's bfloat16
products says nothing about a CPU without them. `check_recorded.py` reruns every entry of
this machine's kind."""

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


def book() -> dict[str, list[dict]]:
    """Every benchmark's entries, one per kind of CPU."""
    with open(PATH) as f:
        return {name: entries for name, entries in json.load(f).items() if not name.startswith("_")}


def recorded(name: str) -> list[dict]:
    return book().get(name, [])


def entry_for(name: str, here: str | None = None, result: dict | None = None) -> dict | None:
    """``name``'s entry for this kind of CPU (``here``: a :func:`cpu` line), or None; with
    ``result``, the first whose settings it has (a kind may hold entries of several settings)."""
    here = cpu() if here is None else here
    mine = [e for e in recorded(name) if same_kind(e.get("cpu", ""), here)]
    if result is not None:
        settings = {**result.get("settings", {}), **result}  # settings may sit at the top or under "settings"
        mine = [e for e in mine if all(settings.get(k) == v for k, v in e.get("settings", {}).items())] or mine
    return mine[0] if mine else None


def regressions(name: str, result: dict, tolerance: float = TOLERANCE) -> list[str]:
    """The lines saying which of ``result``'s figures fall more than ``tolerance`` short
    of the recorded ones (figures the result lacks are skipped, and every figure when the
    result's settings differ from the recorded run's)."""
    here = cpu()
    entry = entry_for(name, here, result)
    if entry is None:
        kinds = "; ".join(e.get("cpu", "?") for e in recorded(name)) or "no CPU"
        return [
            f"note: {name}: figures are recorded for {kinds}; this machine is {here}, so they are not "
            "compared (record this kind's in benchmarks/recorded.json)"
        ]
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


# ------------------------------------------------------------------ the README's table

TABLE_START, TABLE_END = "<!-- recorded-table: python benchmarks/recorded.py --write-table -->", "<!-- /recorded-table -->"


def table(entries: dict[str, list[dict]] | None = None) -> str:
    """Every recorded figure as one markdown table: what benchmarks/README.md shows."""
    entries = book() if entries is None else entries
    rows = ["| benchmark | CPU | settings | figure | recorded | commit | command |", "|---|---|---|---|---|---|---|"]
    cell = lambda text: str(text).replace("|", "\\|")  # noqa: E731  (a pipe would end the cell)
    for name, kinds in entries.items():
        for entry in kinds:
            for direction, word in (("higher", "higher is better"), ("lower", "lower is better")):
                for key, value in entry.get(direction, {}).items():
                    settings = ", ".join(f"{k}={v}" for k, v in entry.get("settings", {}).items())
                    rows.append(f"| `{name}` | `{cell(entry.get('cpu', '?'))}` | {cell(settings)} | {key} ({word}) | {value:g} | "
                                f"{entry.get('commit', '?')} | `{cell(entry.get('command', ''))}` |")
    return "\n".join(rows)


def with_table(readme: str, entries: dict[str, list[dict]] | None = None) -> str:
    """``readme`` with the text between its table markers replaced by :func:`table`."""
    head, start, rest = readme.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise SystemExit(f"error: benchmarks/README.md lacks the markers {TABLE_START} ... {TABLE_END}")
    return f"{head}{start}\n{table(entries)}\n{end}{tail}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-table"]:
        print("usage: python benchmarks/recorded.py --write-table  (rewrites benchmarks/README.md's table of "
              "recorded figures from recorded.json)", file=sys.stderr)
        sys.exit(2)
    readme = os.path.join(os.path.dirname(PATH), "README.md")
    with open(readme) as f:
        text = f.read()
    with open(readme, "w") as f:
        f.write(with_table(text))

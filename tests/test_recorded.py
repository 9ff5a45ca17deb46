"""benchmarks/recorded.py: figures recorded on one kind of CPU are compared only on that
kind; a regression past the tolerance is named in a warning line."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import recorded  # noqa: E402

AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse avx avx2 fma
processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse avx avx2 fma
"""
INTEL = """vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""


def test_cpu_line_names_vendor_model_and_features():
    assert recorded.cpu(AMD) == "AuthenticAMD AMD EPYC | avx2"
    assert recorded.cpu(INTEL) == "GenuineIntel Intel(R) Xeon(R) Platinum 8480+ | avx2 avx512f avx512_bf16 amx_tile"


def test_same_kind_ignores_the_model_name_only():
    intel = recorded.cpu(INTEL)
    assert recorded.same_kind(intel, "GenuineIntel | avx2 avx512f avx512_bf16 amx_tile")
    assert not recorded.same_kind(intel, recorded.cpu(AMD))
    assert not recorded.same_kind(intel, "GenuineIntel | avx2 avx512f")


@pytest.fixture
def entry(monkeypatch):
    book = {"commit": "abc1234", "command": "python x.py", "higher": {"ratio": 2.0}, "lower": {"seconds": 1.0},
            "settings": {"env": "pendulum"}, "cpu": "AuthenticAMD | avx2"}
    intel = {**book, "higher": {"ratio": 9.0}, "cpu": "GenuineIntel | avx2 avx512f avx512_bf16 amx_tile"}
    monkeypatch.setattr(recorded, "recorded", lambda name: [intel, book])
    return book


def test_regressions_on_the_recorded_kind_of_cpu(entry, monkeypatch):
    monkeypatch.setattr(recorded, "cpu", lambda: "AuthenticAMD AMD EPYC | avx2")
    assert recorded.regressions("x", {"ratio": 1.9, "seconds": 1.05, "env": "pendulum"}) == []
    lines = recorded.regressions("x", {"ratio": 1.7, "seconds": 1.2, "env": "pendulum"})
    assert len(lines) == 2 and all(line.startswith("warning: x:") and "abc1234" in line for line in lines)
    assert "ratio 1.7 is 15% worse" in lines[0] and "seconds 1.2 is 20% worse" in lines[1]
    assert recorded.regressions("x", {"ratio": 0.1, "env": "cheetah"}) == []  # other settings: not comparable


def test_each_kind_of_cpu_is_compared_with_its_own_entry(entry, monkeypatch):
    monkeypatch.setattr(recorded, "cpu", lambda: "GenuineIntel X | avx2 avx512f avx512_bf16 amx_tile")
    (line,) = recorded.regressions("x", {"ratio": 7.0, "env": "pendulum"})  # the Intel entry's 9.0, not AMD's 2.0
    assert line.startswith("warning: x:") and "ratio 7 is 22% worse than the recorded 9" in line


def test_a_kind_of_cpu_without_an_entry_gets_one_note_not_a_comparison(entry, monkeypatch):
    monkeypatch.setattr(recorded, "cpu", lambda: "GenuineIntel Y | avx2 avx512f")
    (line,) = recorded.regressions("x", {"ratio": 0.1, "env": "pendulum"})
    assert line.startswith("note: x:") and "AuthenticAMD | avx2" in line and "not compared" in line


# A figure quoted in the docs as recorded, followed by its marker (bold and a ratio's
# "ratio" word may stand between): `**1.58**<!-- recorded placement_modes ratio 0ba7e48 -->`.
QUOTE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\**<!-- recorded (\w+) (\w+) ([0-9a-f]{7,40}) -->")
DOCS = (ROOT / "README.md", ROOT / "benchmarks" / "README.md")


def test_the_docs_quote_the_recorded_figures_as_recorded():
    book = recorded.book()
    quoted = 0
    for doc in DOCS:
        for match in QUOTE.finditer(doc.read_text()):
            text, name, key, commit = match.groups()
            entry = next((e for e in book.get(name, []) if e.get("commit") == commit), None)
            assert entry is not None, f"{doc.name}: no recorded entry {name} at {commit}"
            figures = {**entry.get("higher", {}), **entry.get("lower", {})}
            assert key in figures, f"{doc.name}: {name} at {commit} records no {key}"
            decimals = len(text.partition(".")[2])
            assert round(figures[key], decimals) == float(text.replace(",", "")), (
                f"{doc.name} quotes {name} {key} as {text}; recorded.json holds {figures[key]}")
            quoted += 1
    # Every benchmark's headline ratio is quoted somewhere, beside the prose that explains it.
    for name, entries in book.items():
        for entry in entries:
            key = next(iter(entry.get("higher", {})))
            assert any(f"<!-- recorded {name} {key} {entry['commit']} -->" in d.read_text() for d in DOCS), (
                f"{name}'s {key} at {entry['commit']} is quoted nowhere with its marker")
    assert quoted >= len(book)


def test_the_readme_table_is_written_from_the_file():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert recorded.with_table(readme) == readme, "run python benchmarks/recorded.py --write-table"
    assert recorded.table().count("\n") + 1 == 2 + sum(
        len(e.get("higher", {})) + len(e.get("lower", {})) for entries in recorded.book().values() for e in entries)


def test_check_recorded_reruns_this_kinds_commands_and_fails_on_a_regression(tmp_path, monkeypatch, capsys):
    import check_recorded

    figure = lambda value: f"python -c \"import json; print('log'); print(json.dumps({{'ratio': {value}}}))\""  # noqa: E731
    entries = {"_about": "x",
               "fast": [{"commit": "abc1234", "command": figure(1.9), "higher": {"ratio": 2.0}, "cpu": "AuthenticAMD | avx2"}],
               "slow": [{"commit": "abc1234", "command": figure(1.5), "higher": {"ratio": 2.0}, "cpu": "AuthenticAMD | avx2"},
                        {"commit": "def5678", "command": "exit 3", "higher": {"ratio": 1.0}, "cpu": "GenuineIntel | avx2"}],
               "broken": [{"commit": "abc1234", "command": "exit 3", "higher": {"ratio": 1.0}, "cpu": "AuthenticAMD | avx2"}]}
    (tmp_path / "recorded.json").write_text(json.dumps(entries))
    monkeypatch.setattr(recorded, "PATH", str(tmp_path / "recorded.json"))
    monkeypatch.setattr(recorded, "cpu", lambda: "AuthenticAMD AMD EPYC | avx2")
    assert check_recorded.main(["--only", "fast"]) == 0  # 1.9 is within 15% of 2.0
    assert "1 of 1 hold within 15%" in capsys.readouterr().out
    assert check_recorded.main(["--only", "slow"]) == 1  # 1.5 is 25% worse; the Intel entry is not run
    assert "ratio 1.5 is 25% worse than the recorded 2" in capsys.readouterr().out
    assert check_recorded.main(["--only", "broken"]) == 1
    assert "failed: exit 3" in capsys.readouterr().out
    assert check_recorded.main(["--only", "nothing"]) == 2
    monkeypatch.setattr(recorded, "cpu", lambda: "GenuineIntel X | avx2 avx512f")
    assert check_recorded.main([]) == 2 and "nothing is recorded for this kind" in capsys.readouterr().err

"""benchmarks/recorded.py: figures recorded on one kind of CPU are compared only on that
kind; a regression past the tolerance is named in a warning line."""

from __future__ import annotations

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
    monkeypatch.setattr(recorded, "recorded", lambda name: book)
    return book


def test_regressions_on_the_recorded_kind_of_cpu(entry, monkeypatch):
    monkeypatch.setattr(recorded, "cpu", lambda: "AuthenticAMD AMD EPYC | avx2")
    assert recorded.regressions("x", {"ratio": 1.9, "seconds": 1.05, "env": "pendulum"}) == []
    lines = recorded.regressions("x", {"ratio": 1.7, "seconds": 1.2, "env": "pendulum"})
    assert len(lines) == 2 and all(line.startswith("warning: x:") and "abc1234" in line for line in lines)
    assert "ratio 1.7 is 15% worse" in lines[0] and "seconds 1.2 is 20% worse" in lines[1]
    assert recorded.regressions("x", {"ratio": 0.1, "env": "cheetah"}) == []  # other settings: not comparable


def test_another_kind_of_cpu_gets_one_note_not_a_comparison(entry, monkeypatch):
    monkeypatch.setattr(recorded, "cpu", lambda: "GenuineIntel X | avx2 avx512f avx512_bf16 amx_tile")
    (line,) = recorded.regressions("x", {"ratio": 0.1, "env": "pendulum"})
    assert line.startswith("note: x:") and "AuthenticAMD | avx2" in line and "not compared" in line

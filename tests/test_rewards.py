"""Reasoning rewards: answer checking on tricky answers, format and overlong terms against hand
values, and failing checkers (raising, hanging, ignoring the alarm, dying) scoring 0 and being
counted without stopping the batch."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

pytest.importorskip("math_verify")

from rlinf_jax.errors import BadInput
from rlinf_jax.rewards import (
    CheckerPool,
    MathAnswerChecker,
    RewardConfig,
    RewardFunction,
    boxed_contents,
    call_with_timeout,
    extract_answer,
    format_ok,
    last_number,
    overlong_penalty,
)
from rlinf_jax.rewards.pool import SoftTimeout

# (response, reference answer, correct?) — expected values decided by hand.
TRICKY = [
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{\\frac{1}{2}}", "1/2", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("so the answer is 1/2", "\\frac{1}{2}", True),  # no box: last number (a fraction)
    ("\\boxed{3}", "3.0", True),
    ("\\boxed{3.0}", "3", True),
    ("We add them. The answer is \\boxed{7} apples, I think.", "7", True),
    ("First \\boxed{5}, then on reflection \\boxed{3}", "3", True),  # multiple boxes: the last
    ("First \\boxed{3}, then on reflection \\boxed{5}", "3", False),
    ("3 + 4 gives 7", "7", True),  # no box: final number
    ("I get 42 and then 7", "42", False),  # the last number is what counts
    ("2 - 5 = -3", "-3", True),  # a sign after "=" is a sign, not an operator
    ("\\boxed{41}", "42", False),
    ("", "42", False),
    ("no numbers here at all", "42", False),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{\\frac{6}{2}}", "3", True),  # integer reference, non-integer form: math-verify decides
    ("\\boxed{2^{1/2}}", "\\sqrt{2}", True),
    ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", False),
    ("\\boxed{x = 3}", "3", True),
    ("\\boxed{\\frac{1}{3}}", "0.5", False),
]


# Checkers for the failure tests; top level so checker processes can unpickle them.
def picky_checker(response, answer):
    if "boom" in response:
        raise ValueError("checker exploded")
    return MathAnswerChecker()(response, answer)


def spinning_checker(response, answer):
    if "hang" in response:
        while True:  # pure Python: the soft alarm interrupts it
            pass
    return float(response.strip() == answer)


def deaf_checker(response, answer):
    if "hang" in response:
        # Blocked alarm: only the parent's hard deadline (kill) ends this.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(120)
    return float(response.strip() == answer)


def dying_checker(response, answer):
    if "die" in response:
        os._exit(3)
    return float(response.strip() == answer)


def junk_checker(response, answer):
    return "not a score"


@pytest.fixture(scope="module")
def pooled():
    rf = RewardFunction(RewardConfig(num_workers=2, fast_path=False))
    yield rf
    rf.close()


def test_tricky_answers_in_checker_processes(pooled):
    res = pooled([r for r, _, _ in TRICKY], [a for _, a, _ in TRICKY])
    expected = np.array([float(c) for _, _, c in TRICKY], np.float32)
    wrong = [(TRICKY[i][:2], res.rewards[i]) for i in np.flatnonzero(res.rewards != expected)]
    assert not wrong
    assert res.metrics["reward/accuracy"] == pytest.approx(expected.mean())
    assert res.metrics["reward/errors"] == 0 and res.metrics["reward/timeouts"] == 0
    assert res.metrics["reward/fast_path"] == 0.0


def test_fast_path_agrees_with_math_verify(pooled):
    check = MathAnswerChecker()
    responses = [r for r, _, _ in TRICKY] + ["\\boxed{+12}", "\\boxed{ 12 }", "12.000", "\\boxed{12.5}", "\\boxed{$12$}"]
    answers = [a for _, a, _ in TRICKY] + ["12"] * 5
    settled = [(r, a, check.fast(r, a)) for r, a in zip(responses, answers)]
    fast_ones = [(r, a, s) for r, a, s in settled if s is not None]
    assert len(fast_ones) >= 14  # integer references with integer-looking candidates
    # Non-integer candidates and references are left to math-verify.
    assert check.fast("\\boxed{\\frac{6}{2}}", "3") is None and check.fast("\\boxed{3}", "3.0") is None
    slow = pooled([r for r, _, _ in fast_ones], [a for _, a, _ in fast_ones])
    assert [s for _, _, s in fast_ones] == slow.rewards.tolist()
    # With the fast path on, the same batch never starts a checker process.
    rf = RewardFunction(RewardConfig(num_workers=2))
    res = rf([r for r, _, _ in fast_ones], [a for _, a, _ in fast_ones])
    assert rf._pool is None and res.metrics["reward/fast_path"] == 1.0
    assert res.rewards.tolist() == slow.rewards.tolist()


def test_extraction_helpers():
    assert boxed_contents("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}} c \\boxed{open") == ["\\frac{1}{2}", "x^{2}"]
    assert boxed_contents("\\fbox{4}") == ["4"]
    assert last_number("3, 4") == "4"
    assert last_number("a total of 1,234.5 units") == "1,234.5"
    assert last_number("x-1") == "1" and last_number("it is -1") == "-1"
    assert last_number("nothing") is None
    assert extract_answer("9 then \\boxed{8} then 7") == "8"  # a box beats any later number
    assert extract_answer("the result is 7", fallback="none") is None
    assert MathAnswerChecker(fallback="none")("the result is 7", "7") == 0.0
    assert MathAnswerChecker(fallback="math_verify")("the final answer is $7$.", "7") == 1.0


def test_format_reward_and_reward_mapping():
    cfg = RewardConfig(correct_reward=1.0, wrong_reward=-0.5, format_reward=0.25, format_tag="</think>", num_workers=0)
    rf = RewardFunction(cfg)
    responses = [
        "</think> \\boxed{7}",  # right, formatted: 1 + 0.25
        "\\boxed{7}",  # right, tag missing: 1
        "</think> \\boxed{6}",  # wrong, formatted: -0.5 + 0.25
        "</think> \\boxed{6} \\boxed{7}",  # right (last box), two boxes: 1
        "</think> 7",  # right by the last number, no box: 1
    ]
    res = rf(responses, ["7"] * 5)
    np.testing.assert_allclose(res.rewards, [1.25, 1.0, -0.25, 1.0, 1.0])
    assert res.metrics["reward/format"] == pytest.approx(2 / 5)
    assert format_ok("\\boxed{1}") and not format_ok("\\boxed{1}\\boxed{2}") and not format_ok("1")


def test_overlong_shaping_matches_hand_formula():
    max_len, cache, factor = 20, 8, 0.5
    rf = RewardFunction(RewardConfig(overlong_max_len=max_len, overlong_cache_len=cache, overlong_factor=factor, num_workers=0))
    lengths = np.arange(0, 26)
    res = rf(["\\boxed{1}"] * len(lengths), ["1"] * len(lengths), lengths)
    expected = []
    for L in lengths:  # DAPO eq. 13 written out
        if L <= max_len - cache:
            pen = 0.0
        elif L <= max_len:
            pen = ((max_len - cache) - L) / cache
        else:
            pen = -1.0
        expected.append(1.0 + factor * pen)
    np.testing.assert_allclose(res.rewards, expected, rtol=1e-6, atol=1e-6)
    assert res.metrics["reward/overlong_frac"] == pytest.approx(np.mean(lengths > max_len - cache))


def test_raising_checker_scores_zero_and_is_counted():
    responses = ["\\boxed{7}", "boom \\boxed{7}", "\\boxed{8}", "boom"]
    cfg = RewardConfig(correct_reward=1.0, format_reward=0.5, overlong_max_len=10, overlong_cache_len=5)
    for workers in (0, 1):
        rf = RewardFunction(RewardConfig(**{**cfg.__dict__, "num_workers": workers}), checker=picky_checker)
        try:
            res = rf(responses, ["7"] * 4, [3, 3, 3, 30])
        finally:
            rf.close()
        # The failed ones get 0 in total: no format bonus, no length penalty.
        np.testing.assert_allclose(res.rewards, [1.5, 0.0, 0.5, 0.0])
        assert res.failed.tolist() == [False, True, False, True]
        assert res.metrics["reward/errors"] == 2 and res.metrics["reward/timeouts"] == 0


def test_soft_timeout_keeps_the_worker():
    # Limits generous enough for the quick checks on a loaded machine; the spinning ones never end.
    rf = RewardFunction(RewardConfig(num_workers=1, timeout_s=2.0), checker=spinning_checker)
    try:
        t0 = time.monotonic()
        res = rf(["hang", "7", "hang", "6"], ["7", "7", "7", "6"])
        took = time.monotonic() - t0
        assert res.rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
        assert res.metrics["reward/timeouts"] == 2 and res.metrics["reward/errors"] == 0
        assert rf._pool.restarts == 0  # interrupted in place, not killed
        assert took < 15.0
    finally:
        rf.close()


def test_inline_soft_timeout_in_main_thread():
    rf = RewardFunction(RewardConfig(num_workers=0, timeout_s=1.0), checker=spinning_checker)
    res = rf(["hang", "5"], ["5", "5"])
    assert res.rewards.tolist() == [0.0, 1.0] and res.metrics["reward/timeouts"] == 1
    # Outside the main thread there is no alarm; a well-behaved call still works.
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", rf(["5"], ["5"])))
    t.start()
    t.join()
    assert out["r"].rewards.tolist() == [1.0]


def test_hard_timeout_kills_and_replaces_the_worker():
    with CheckerPool(num_workers=2, timeout_s=2.0, grace_s=1.0, preload=()) as pool:
        t0 = time.monotonic()
        out = pool.map(deaf_checker, [("hang", "1"), ("1", "1"), ("2", "1"), ("3", "3")])
        took = time.monotonic() - t0
        assert out == [("timeout", None), ("ok", 1.0), ("ok", 0.0), ("ok", 1.0)]
        assert pool.restarts == 1 and took < 30.0
        # The replacement serves the next call.
        assert pool.map(deaf_checker, [("4", "4")]) == [("ok", 1.0)]


def test_dying_and_junk_checkers_count_as_errors():
    with CheckerPool(num_workers=1, timeout_s=2.0, preload=()) as pool:
        out = pool.map(dying_checker, [("die", "1"), ("1", "1")])
        assert out[0] == ("error", "checker process died") and out[1] == ("ok", 1.0)
        assert pool.restarts == 1
    rf = RewardFunction(RewardConfig(num_workers=0), checker=junk_checker)
    res = rf(["x"], ["1"])
    assert res.rewards.tolist() == [0.0] and res.metrics["reward/errors"] == 1


def test_a_swallowed_timeout_still_ends_the_call_and_counts():
    # The first alarm lands where its exception is lost (as in a garbage-collector callback);
    # the repeating alarm interrupts the call anyway, and it is reported as a timeout.
    def swallows_once():
        try:
            while True:
                pass
        except SoftTimeout:
            pass
        t = time.monotonic()
        while time.monotonic() - t < 5.0:
            pass
        return 1

    t0 = time.monotonic()
    assert call_with_timeout(swallows_once, (), 0.1) == ("timeout", None)
    assert time.monotonic() - t0 < 2.0

    def swallows_and_returns():
        try:
            while True:
                pass
        except SoftTimeout:
            return 7

    assert call_with_timeout(swallows_and_returns, (), 0.1) == ("timeout", None)


def test_call_with_timeout_outcomes():
    assert call_with_timeout(lambda a, b: a + b, (2, 3), 1.0) == ("ok", 5)
    status, msg = call_with_timeout(picky_checker, ("boom", "1"), 1.0)
    assert status == "error" and msg.startswith("ValueError: checker exploded")
    assert call_with_timeout(spinning_checker, ("hang", "1"), 0.1) == ("timeout", None)
    # The alarm is disarmed afterwards: a later slow-ish call is not interrupted.
    assert call_with_timeout(lambda: time.sleep(0.3) or 1, (), None) == ("ok", 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fallback": "first"},
        {"timeout_s": 0},
        {"num_workers": -2},
        {"overlong_max_len": 10, "overlong_cache_len": 0},
        {"overlong_max_len": 10, "overlong_cache_len": 11},
        {"format_tag": "</think>"},
    ],
)
def test_reward_config_rejects_bad_values(kwargs):
    with pytest.raises(BadInput) as e:
        RewardConfig(**kwargs).validate()
    assert "\n" not in str(e.value) and "reward." in str(e.value)


def test_unpicklable_checker_is_refused_for_processes():
    with pytest.raises(TypeError, match="picklable"):
        RewardFunction(RewardConfig(num_workers=1), checker=lambda r, a: 1.0)
    # In process it is fine.
    assert RewardFunction(RewardConfig(num_workers=0), checker=lambda r, a: 1.0)(["x"], ["y"]).rewards.tolist() == [1.0]


def test_an_outer_alarm_survives_an_inline_check():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(time.monotonic()))
    t0 = time.monotonic()
    prev = signal.setitimer(signal.ITIMER_REAL, 0.5)  # pytest-timeout's own alarm, if any, is put back below
    try:
        assert call_with_timeout(spinning_checker, ("hang", "1"), 0.1) == ("timeout", None)
        assert signal.getsignal(signal.SIGALRM) is not None and 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 0.4
        while not fired and time.monotonic() - t0 < 3:
            time.sleep(0.01)
        assert fired and 0.45 < fired[0] - t0 < 1.5  # the outer alarm fired on its own schedule
    finally:
        signal.signal(signal.SIGALRM, old)
        signal.setitimer(signal.ITIMER_REAL, max(prev[0] - (time.monotonic() - t0), 0.0) if prev[0] else 0.0, prev[1])


def test_overlong_penalty_hand_example():
    # max_len 10, cache 4: 0 up to 6, then (6 - L)/4, -1 beyond 10.
    out = np.asarray(overlong_penalty(np.array([0, 6, 7, 8, 10, 11, 50]), 10, 4))
    np.testing.assert_allclose(out, [0, 0, -0.25, -0.5, -1, -1, -1])


class _FastPathChecker:
    """A checker whose in-process fast path misbehaves on some responses."""

    def fast(self, response, answer):
        if "raise" in response:
            raise ValueError("fast path exploded")
        if "spin" in response:
            while True:  # the in-process alarm interrupts it
                pass
        return float(response.strip() == answer)

    def __call__(self, response, answer):
        return float(response.strip() == answer)


@pytest.mark.timeout(120)
def test_unterminated_boxes_are_scanned_in_one_pass():
    # 700 KB of open boxes did not finish under the first scanner (quadratic); now the whole
    # batch is scored well inside the checker's time limit and nothing counts as a timeout.
    bomb = "\\boxed{" * 100_000
    rf = RewardFunction(RewardConfig(num_workers=0, timeout_s=5.0, format_reward=0.5))
    res = rf([bomb, bomb + "\\boxed{7}", "\\boxed{7}"], ["7", "7", "7"])
    assert res.metrics["reward/timeouts"] == 0 and res.metrics["reward/errors"] == 0
    np.testing.assert_allclose(res.rewards, [0.0, 1.5, 1.5])
    assert boxed_contents("\\boxed{a\\boxed{b}c} \\boxed{") == ["a\\boxed{b}c", "b"]


def test_integers_past_pythons_digit_limit_compare_exactly():
    big = "9" * 5000
    rf = RewardFunction(RewardConfig(num_workers=0))
    res = rf([f"\\boxed{{{big}}}", f"\\boxed{{{big}8}}", f"\\boxed{{-00{big}}}", "\\boxed{+007}"], [big, big, f"-{big}", "7"])
    assert res.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert res.metrics["reward/errors"] == 0 and res.metrics["reward/fast_path"] == 1.0


def test_a_failing_fast_path_scores_zero_and_is_bounded():
    rf = RewardFunction(RewardConfig(num_workers=0, timeout_s=1.0), checker=_FastPathChecker())
    res = rf(["raise", "7", "spin", "8"], ["7", "7", "7", "8"])
    assert res.rewards.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert res.failed.tolist() == [True, False, True, False]
    assert res.metrics["reward/errors"] == 1 and res.metrics["reward/timeouts"] == 1


def test_only_the_tail_of_a_runaway_response_is_scanned():
    from rlinf_jax.rewards.answers import MAX_SCAN_CHARS

    answer_first = "\\boxed{7}" + "x" * MAX_SCAN_CHARS
    assert extract_answer(answer_first) is None and extract_answer("x" * MAX_SCAN_CHARS + "\\boxed{7}") == "7"
    assert last_number("1 " + "y" * MAX_SCAN_CHARS) is None

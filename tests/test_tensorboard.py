"""TensorBoard as a user opens it, read back with the tensorboard package's own reader: every
scalar of metrics.jsonl at the same step, the resolved config as text at step 0, sample
generations as text and a VLA's episodes as an image at evaluation steps.

The checks of whole runs (`check_run`) are made on the runs of
``tests/test_failures.py::test_every_workload_exits_promptly_after_its_last_line``, one per
workload, rather than on runs of their own."""

from __future__ import annotations

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlinf_jax.runtime import MetricsLogger, read_metrics


def events(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    acc.Reload()
    return acc


def texts(acc, tag) -> dict[int, str]:
    return {e.step: e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{tag}/text_summary")}


def same_scalars(run_dir, acc) -> None:
    records = read_metrics(run_dir)
    for key in {k for r in records for k in r if k != "step"}:
        want = [(r["step"], r[key]) for r in records if key in r]
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in want], key
        np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=1e-6, err_msg=key)


def check_run(workload: str, run_dir) -> None:
    """What TensorBoard shows of a finished run of ``workload`` (2 iterations, evaluated at 2)."""
    acc = events(run_dir)
    same_scalars(run_dir, acc)
    config = texts(acc, "config")
    assert list(config) == [0] and (run_dir / "config.yaml").read_text().strip() in config[0]
    if workload in ("sft", "reasoning"):
        samples = texts(acc, "eval/samples")
        assert sorted(samples) == [0, 2]  # before training and at the evaluation
        lines = samples[2].splitlines()
        assert lines[0] == "| prompt | answer | response | correct |" and len(lines) == 2 + 8
        # data.eval_size=8: every held-out problem is shown, as many right as the metric says.
        accuracy = [r["eval/accuracy"] for r in read_metrics(run_dir) if r["step"] == 2][0]
        assert sum(ln.endswith("| yes |") for ln in lines[2:]) == pytest.approx(accuracy * 8)
    if workload == "vla":
        images = acc.Images("eval/episodes")
        assert [e.step for e in images] == [2]
        # 4 episodes of 16x16 frames as rows; a column per policy step and the first frame.
        assert (images[0].height, images[0].width) == (4 * 16 + 3, 3 * 16 + 2)


def test_the_logger_writes_text_and_images_the_reader_finds(tmp_path):
    image = np.zeros((5, 7, 3), np.uint8)
    image[1, 2] = (255, 0, 0)
    with MetricsLogger(tmp_path) as logger:
        logger.log(0, {"a": 1.5})
        logger.log_text(0, "config", "runner:\n  seed: 3")
        logger.log_image(4, "eval/episodes", image)
    acc = events(tmp_path)
    assert texts(acc, "config") == {0: "runner:\n  seed: 3"}
    [shown] = acc.Images("eval/episodes")
    assert (shown.step, shown.height, shown.width) == (4, 5, 7)
    same_scalars(tmp_path, acc)
    # A logger that writes nothing (processes other than 0) shows nothing.
    with MetricsLogger(tmp_path / "quiet", write=False) as quiet:
        quiet.log_text(0, "config", "x")
    assert not (tmp_path / "quiet" / "tensorboard").exists()

"""Metrics: metrics.jsonl lines with verl's names, TensorBoard events, the console line, means."""

import json

import numpy as np
import torch

from verl_runtime.metrics import MetricsWriter, format_console_line, read_metrics, reduce_metrics


def test_one_json_object_per_step(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        writer.log(1, {"critic/score/mean": torch.tensor(0.25), "actor/pg_loss": np.float32(-0.5), "timing_s/step": 1.5})
        writer.log(2, {"critic/score/mean": 0.5, "actor/pg_loss": -0.25, "timing_s/step": 1.25})
        # Each line is on disk as soon as it is logged, so `status` can follow a live run.
        assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 1, "critic/score/mean": 0.25, "actor/pg_loss": -0.5, "timing_s/step": 1.5}
    assert [record["step"] for record in read_metrics(tmp_path)] == [1, 2]


def test_resume_drops_lines_after_the_checkpoint_step(tmp_path):
    with MetricsWriter(tmp_path) as writer:
        for step in (1, 2, 3):
            writer.log(step, {"loss": float(step)})
    # Crashed after step 3, last checkpoint at step 2: the resumed run writes step 3 again.
    with MetricsWriter(tmp_path, truncate_after=2) as writer:
        writer.log(3, {"loss": 30.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]


TORN = '{"step": 3, "ac'  # the process died while writing step 3's line


def write_lines(path, *steps, tail=""):
    path.write_text("".join(json.dumps({"step": step, "loss": float(step)}) + "\n" for step in steps) + tail)


def test_a_torn_last_line_is_dropped_before_the_next_record(tmp_path, capsys):
    write_lines(tmp_path / "metrics.jsonl", 1, 2, tail=TORN)
    with MetricsWriter(tmp_path) as writer:
        writer.log(3, {"loss": 3.0})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]  # every line parses: none joined the torn one
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[WARN]")]
    assert len(warnings) == 1 and "torn line" in warnings[0], warnings


def test_resume_drops_a_torn_line_instead_of_failing(tmp_path, capsys):
    write_lines(tmp_path / "metrics.jsonl", 1, 2, 3, tail=TORN)
    with MetricsWriter(tmp_path, truncate_after=2) as writer:
        writer.log(3, {"loss": 30.0})
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert capsys.readouterr().out.count("[WARN]") == 1


def test_read_metrics_skips_a_torn_last_line(tmp_path):
    write_lines(tmp_path / "metrics.jsonl", 1, 2, tail=TORN)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_tensorboard_events_are_written_when_asked(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsWriter(tmp_path, tensorboard=True) as writer:
        writer.log(1, {"critic/score/mean": 0.1, "note": "text is skipped"})
        writer.log(2, {"critic/score/mean": 0.3})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("critic/score/mean")] == [(1, 0.1), (2, 0.3)]


def test_no_tensorboard_unless_asked(tmp_path):
    MetricsWriter(tmp_path).close()
    assert (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()


def test_console_line_is_compact():
    metrics = {
        "critic/score/mean": 0.41234,
        "actor/pg_loss": 0.43214,
        "actor/kl_loss": 0.00123,
        "response_length/mean": 17.3,
        "perf/throughput": 1234.4,
        "timing_s/step": 0.8123,
    }
    assert format_console_line(3, 20, metrics) == (
        "step  3/20 | reward 0.412 | loss 0.4321 | kl 0.0012 | len 17.3 | 1,234 tok/s | 0.81 s/step"
    )
    assert format_console_line(1, 8, {"loss": 0.5}) == "step 1/8 | loss 0.5000"


def test_reduce_metrics_averages_each_key_where_reported():
    reduced = reduce_metrics([{"a": 1.0, "b": torch.tensor(2.0)}, {"a": 3.0}, {"a": 5.0, "b": 4.0}])
    assert reduced == {"a": 3.0, "b": 3.0}

"""Metrics: metrics.jsonl lines with verl's names, TensorBoard events, the console line, means."""

import json
import subprocess
import sys

import numpy as np
import pytest
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
    # a multi-turn run also shows its tool calls per episode
    assert format_console_line(1, 8, {"critic/score/mean": 0.5, "tool_calls/mean": 0.875}) == (
        "step 1/8 | reward 0.500 | tool calls 0.88"
    )


def test_reduce_metrics_averages_each_key_where_reported():
    reduced = reduce_metrics([{"a": 1.0, "b": torch.tensor(2.0)}, {"a": 3.0}, {"a": 5.0, "b": 4.0}])
    assert reduced == {"a": 3.0, "b": 3.0}


# --- what an ML engineer watches: elapsed time and ETA, validation lines, TensorBoard by default -----------------


def test_console_line_ends_with_elapsed_time_and_eta():
    from verl_runtime.metrics import format_duration

    line = format_console_line(3, 20, {"loss": 0.4321, "timing_s/step": 0.81}, elapsed_s=2.4, eta_s=13.8)
    assert line == "step  3/20 | loss 0.4321 | 0.81 s/step | 0:02 elapsed, ETA 0:14"
    assert format_console_line(1, 8, {"loss": 0.5}, elapsed_s=5.0) == "step 1/8 | loss 0.5000 | 0:05 elapsed"
    assert [format_duration(s) for s in (0, 59.6, 754, 3723)] == ["0:00", "1:00", "12:34", "1:02:03"]


def test_eta_is_the_mean_step_time_without_the_warm_up_step():
    from verl_runtime.metrics import eta_seconds

    assert eta_seconds([], 10) is None  # nothing measured yet
    assert eta_seconds([5.0], 10) == 50.0  # only the first step: it is all there is
    assert eta_seconds([5.0, 1.0, 2.0], 10) == 15.0  # the first (warm-up) step left out
    assert eta_seconds([5.0, 1.0], 0) == 0.0  # the last step


def test_step_clock_times_this_process_s_steps():
    import time

    from verl_runtime.metrics import StepClock

    clock = StepClock()
    time.sleep(0.05)
    elapsed, eta = clock.lap(remaining=3)  # one step measured: the ETA uses it
    assert 0.05 <= elapsed < 1 and eta == pytest.approx(3 * clock.durations[0])
    elapsed, eta = clock.lap(remaining=0)
    assert len(clock.durations) == 2 and eta == 0.0


def test_validation_line_names_each_score():
    from verl_runtime.metrics import format_validation_line

    scores = {"val-core/openai/gsm8k/reward/mean@1": 0.25, "val-core/toy/letter/reward/mean@1": torch.tensor(0.5)}
    assert format_validation_line(4, scores) == (
        "[VAL] step 4 | val-core/openai/gsm8k/reward/mean@1 0.250 | val-core/toy/letter/reward/mean@1 0.500")


def test_tensorboard_is_on_by_default_and_verl_s_console_logger_turns_it_off():
    from verl_runtime.config import get_default_config, load_config

    assert get_default_config().trainer.tensorboard is True
    assert load_config(None, ["trainer.logger=['console']"]).trainer.tensorboard is False
    assert load_config(None, ["trainer.logger=['console','tensorboard']"]).trainer.tensorboard is True


def test_tensorboard_events_say_how_to_open_them(tmp_path, capsys):
    MetricsWriter(tmp_path, tensorboard=True).close()
    assert f"[INFO] TensorBoard: tensorboard --logdir {tmp_path / 'tensorboard'}" in capsys.readouterr().out


def test_a_missing_tensorboard_package_warns_once_and_metrics_go_on(tmp_path):
    """An image without the tensorboard package: the run goes on with metrics.jsonl (None in sys.modules makes
    every `import tensorboard` fail, as an absent package does)."""
    code = (f"import sys; sys.modules['tensorboard'] = None\n"
            f"from verl_runtime.metrics import MetricsWriter\n"
            f"with MetricsWriter({str(tmp_path)!r}, tensorboard=True) as w:\n"
            f"    w.log(1, {{'loss': 0.5}}); w.log(2, {{'loss': 0.25}})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stdout.splitlines() if line.startswith("[WARN]")]
    assert len(warnings) == 1 and "TensorBoard is off" in warnings[0] and "pip install tensorboard" in warnings[0]
    assert [r["loss"] for r in read_metrics(tmp_path)] == [0.5, 0.25]
    assert not (tmp_path / "tensorboard").exists()


def test_tensorboard_costs_a_step_one_event_not_one_per_scalar(tmp_path):
    """A CPU race's steps take tens of ms: one event per step holding every scalar keeps TensorBoard out of the
    way, where SummaryWriter.add_scalar (an event per scalar) is what a step would feel. Best of 5 rounds each,
    so a busy machine does not decide it."""
    import time

    from torch.utils.tensorboard import SummaryWriter

    metrics = {f"group/metric_{i}": 0.5 * i for i in range(60)}  # about what one step of the trainer writes

    def best_of_5(log_step) -> float:
        rounds = []
        for _ in range(5):
            started = time.perf_counter()
            for step in range(30):
                log_step(step)
            rounds.append(time.perf_counter() - started)
        return min(rounds)

    with MetricsWriter(tmp_path / "ours", tensorboard=True) as writer:
        ours = best_of_5(lambda step: writer.log(step, metrics))
    per_scalar = SummaryWriter(str(tmp_path / "per_scalar"))
    theirs = best_of_5(lambda step: [per_scalar.add_scalar(name, value, step) for name, value in metrics.items()])
    per_scalar.close()
    assert ours * 3 < theirs, f"{ours / 30 * 1000:.2f} ms per step, add_scalar: {theirs / 30 * 1000:.2f} ms"

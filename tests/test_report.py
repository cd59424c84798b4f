"""`verl-deploy report`: charts of runs' metrics.jsonl as one self-contained HTML page (and PNGs), opened in a real
headless Chromium to see that the charts render."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from conftest import REPO, require
from verl_deploy.cli import app
from verl_runtime.metrics import MetricsWriter

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def write_run(run_dir, steps=6, grad_norm=True, val_every=3, slope=0.1):
    """A run directory with the metrics our runtime writes for each step (a real metrics.jsonl)."""
    with MetricsWriter(run_dir) as writer:
        for step in range(1, steps + 1):
            metrics = {
                "critic/score/mean": slope * step, "actor/pg_loss": -0.01 * step, "actor/kl_loss": 0.001 * step,
                "actor/entropy": 2.0 - 0.1 * step, "response_length/mean": 12.0 + step,
                "perf/throughput": 1000.0 + 10 * step, "timing_s/gen": 0.5, "timing_s/update_actor": 0.25,
                "timing_s/step": 0.8,
            }
            if grad_norm:
                metrics["actor/grad_norm"] = 1.0 / step
            if step % val_every == 0:
                metrics["val-core/toy/letter/reward/mean@1"] = slope * step
            writer.log(step, metrics)
    return run_dir


def write_verl_run(run_dir, steps=4):
    """Upstream verl's file logger: {"step": N, "data": {...}} lines."""
    run_dir.mkdir(parents=True)
    lines = [{"step": s, "data": {"critic/score/mean": 0.2 * s, "actor/ppo_kl": 0.01, "timing_s/gen": 1.0}}
             for s in range(1, steps + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_dir


def report(*args):
    return CliRunner().invoke(app, ["report", *map(str, args)])


@pytest.fixture
def two_runs(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "lr-high", slope=0.1)
    write_run(root / "lr-low", slope=0.05, grad_norm=False)
    return root


def test_report_overlays_runs_in_one_self_contained_page(two_runs, tmp_path):
    out = tmp_path / "out"
    result = report("lr-high", "lr-low", "--runs-dir", two_runs, "--out", out)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"wrote {out / 'index.html'}: 8 charts; open it in a browser"
    page = (out / "index.html").read_text()
    names = ("score", "kl", "entropy", "response_length", "grad_norm", "throughput", "timing", "validation")
    for name in names:
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and f'<section id="{name}">' in page
    assert page.count('src="data:image/png;base64,') == len(names)
    assert not re.search(r"(src|href)=\"(?!data:)", page) and "http://" not in page and "https://" not in page
    assert "lr-low has no actor/grad_norm" in page  # a metric one run lacks: a note under its chart
    assert "toy/letter/reward/mean@1 0.600" in page  # the summary table's last validation score


def test_without_out_the_report_goes_into_the_run_s_directory_not_the_current_one(two_runs, tmp_path, monkeypatch):
    here = tmp_path / "checkout"
    here.mkdir()
    monkeypatch.chdir(here)
    result = report("lr-high", "--runs-dir", two_runs)
    assert result.exit_code == 0, result.output
    page = (two_runs / "lr-high" / "report" / "index.html").resolve()
    assert result.output.strip() == f"wrote {page}: 8 charts; open it in a browser"
    assert page.is_file() and list(here.iterdir()) == []
    # Several runs: the first one's directory, named for the others.
    result = report("lr-high", "lr-low", "--runs-dir", two_runs)
    assert result.exit_code == 0, result.output
    page = (two_runs / "lr-high" / "report-vs-lr-low" / "index.html").resolve()
    assert result.output.startswith(f"wrote {page}: 8 charts") and page.is_file() and list(here.iterdir()) == []


def test_report_takes_a_run_directory_and_verl_s_own_lines(tmp_path):
    run = write_verl_run(tmp_path / "elsewhere" / "verl-run")
    out = tmp_path / "out"
    result = report(run, "--runs-dir", tmp_path / "runs", "--out", out)
    assert result.exit_code == 0, result.output
    assert "3 charts" in result.output and "no data for: Entropy" in result.output
    assert sorted(p.name for p in out.glob("*.png")) == ["kl.png", "score.png", "timing.png"]
    assert "Grad norm (actor/grad_norm)" in (out / "index.html").read_text()  # listed under "Not in these runs"


def test_an_unknown_run_is_one_line_and_exit_2(two_runs, tmp_path):
    result = report("lr-high", "nope", "--runs-dir", two_runs, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: no run 'nope': neither a run under {two_runs}/ (`verl-deploy runs` lists them) nor a run directory"]
    assert not (tmp_path / "out").exists()


def test_a_run_without_metrics_is_one_line_and_exit_2(two_runs, tmp_path):
    (two_runs / "starting").mkdir()
    result = report("starting", "--runs-dir", two_runs, "--out", tmp_path / "out")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "run 'starting' has no metrics yet" in result.output and "Traceback" not in result.output


def test_an_unwritable_output_is_one_line_and_exit_2(two_runs, tmp_path):
    (tmp_path / "file").write_text("")
    result = report("lr-high", "--runs-dir", two_runs, "--out", tmp_path / "file" / "out")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("error: cannot write the report to ") and "choose another --out" in result.output


def test_the_cli_starts_without_matplotlib():
    code = ("import sys; from typer.testing import CliRunner; from verl_deploy.cli import app; "
            "r = CliRunner().invoke(app, ['report', '--help']); assert r.exit_code == 0, r.output; "
            "heavy = [m for m in ('matplotlib', 'numpy', 'torch') if m in sys.modules]; "
            "assert not heavy, heavy; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


# --- in a real browser ------------------------------------------------------------------------------------------


def browser() -> str:
    found = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    require(found is not None, "no headless Chromium (.ci/services.sh installs chromium-headless-shell)")
    return found


def open_in_browser(page, *flags):
    """Chromium's headless run of a local page (no network, no profile kept); its stdout."""
    command = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={page.parent / '.chromium'}", *flags, page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def assert_renders(page, charts: int):
    """Every chart image decoded (the page's own script marks it) and the page is not blank."""
    from PIL import Image

    dom = open_in_browser(page, "--dump-dom")
    assert f'data-rendered="{charts}/{charts}"' in dom, dom[:500]
    shot = page.parent / "screenshot.png"
    open_in_browser(page, f"--screenshot={shot}", "--window-size=900,1600", "--hide-scrollbars")
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is (nearly) one colour: nothing drew"


def test_the_report_renders_in_headless_chromium(two_runs, tmp_path):
    result = report("lr-high", "lr-low", "--runs-dir", two_runs, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert_renders(tmp_path / "out" / "index.html", charts=8)


@pytest.mark.slow
def test_a_quickstart_run_shows_its_progress_and_reports_in_a_browser(tmp_path):
    """The quickstart's own entrypoint, 4 steps: ETA on every progress line, validation scores as they come,
    the TensorBoard command; then its report opens in Chromium."""
    run_dir = tmp_path / "runs" / "quick"
    done = subprocess.run(
        [sys.executable, "-m", "verl_runtime", "train", str(REPO / "examples" / "quickstart.yaml"),
         "--set", "trainer.total_training_steps=4", "--set", "trainer.test_freq=2",
         "--set", "trainer.val_before_train=true", "--set", f"trainer.run_dir={run_dir}"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    progress = [line for line in lines if line.startswith("step ")]
    assert len(progress) == 4 and all(re.search(r"\| \d+:\d\d elapsed, ETA \d+:\d\d$", p) for p in progress), progress
    assert [line.split(" | ")[0] for line in lines if line.startswith("[VAL]")] == \
        ["[VAL] step 0", "[VAL] step 2", "[VAL] step 4"]
    assert f"[INFO] TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}" in lines
    assert any(p.name.startswith("events.out.tfevents") for p in (run_dir / "tensorboard").iterdir())

    result = report("quick", "--runs-dir", run_dir.parent, "--out", tmp_path / "report")
    assert result.exit_code == 0, result.output
    charts = len(list((tmp_path / "report").glob("*.png")))
    assert charts >= 7, result.output  # KL is off in the quickstart (use_kl_loss: false) ...
    assert_renders(tmp_path / "report" / "index.html", charts=charts)

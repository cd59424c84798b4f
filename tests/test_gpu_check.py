"""`make gpu-check` (bench/gpu_check.py): on this machine, which has no GPU, the one line it says; and a rehearsal of
every check on the CPU preset, so that the script a GPU session runs is known to run end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "s.json")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == ("gpu-check: no CUDA GPU is visible here (torch.cuda.is_available() is False): run "
                                     "it on a machine with an NVIDIA GPU, or rehearse it with --preset cpu")
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow
def test_a_rehearsal_on_the_cpu_runs_every_check_and_writes_one_summary(tmp_path):
    out = tmp_path / "gpu-check.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--preset", "cpu", "--out", str(out)], capture_output=True,
                            text=True, timeout=900, cwd=REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(Path(out).read_text())
    checks = summary["checks"]
    assert list(checks) == ["nvml", "greedy", "generation", "grpo", "multi_gpu", "plan", "offload"]
    assert checks["greedy"]["rows_equal"] == "8 of 8"
    assert checks["generation"]["tokens_per_s"]["builtin"] > 0 and checks["grpo"]["s_per_step"]["ours-builtin"] > 0
    assert checks["multi_gpu"] == {"status": "skip", "why": "fewer than 2 GPUs", "seconds": checks["multi_gpu"]["seconds"]}
    assert checks["plan"]["status"] == "pass" and checks["plan"]["worst_error"] <= 0.15
    assert checks["offload"]["status"] == "pass"  # on the CPU: offload changes no phase's peak, as planned
    assert result.stdout.strip().splitlines()[-1] == f"gpu-check: 7 of 7 checks did not fail; summary: {out}"

"""`make gpu-check` (bench/gpu_check.py): on this machine, which has no GPU, the one line it says; a rehearsal of
every check on the CPU preset; and every line of the GPU branch run here with torch.cuda's calls stood in, so that the
script a GPU session runs is known to run end to end (its first GPU run once crashed on a line no CPU test took)."""

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from conftest import FIXTURES, REPO

SCRIPT = REPO / "bench" / "gpu_check.py"
CHECKS = ["nvml", "greedy", "generation", "grpo", "plan", "offload", "multi_gpu", "trl"]


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
    assert list(checks) == CHECKS
    assert checks["greedy"]["float32"] == {"rows_equal_transformers": 8, "captured_equals_eager": True}
    assert checks["generation"]["tokens_per_s"]["builtin"] > 0 and checks["grpo"]["s_per_step"]["ours-builtin"] > 0
    assert checks["multi_gpu"] == {"status": "skip", "why": "fewer than 2 GPUs", "seconds": checks["multi_gpu"]["seconds"]}
    assert checks["trl"]["status"] == "skip" or checks["trl"]["ours-builtin_vs_trl"] > 0
    assert checks["plan"]["status"] == "pass" and checks["plan"]["worst_error"] <= 0.15
    assert checks["offload"]["status"] == "pass"  # on the CPU: offload changes no phase's peak, as planned
    assert result.stdout.strip().splitlines()[-1] == f"gpu-check: 8 of 8 checks did not fail; summary: {out}"


class StandInCuda:
    """torch.cuda's calls the GPU branch makes, answered on the CPU: memory counters that say nothing of use (the
    point is the code path), a recorded allocation history of one allocation, an H200's size."""

    def __init__(self):
        self.memory = types.SimpleNamespace(_record_memory_history=lambda **kw: None, _snapshot=self._snapshot)
        self.calls = []

    def synchronize(self):
        self.calls.append("synchronize")

    def empty_cache(self):
        pass

    def reset_peak_memory_stats(self):
        pass

    def memory_allocated(self):
        return 0

    def max_memory_allocated(self):
        return 2**20

    def get_device_properties(self, index):
        return types.SimpleNamespace(total_memory=150_000_000_000)

    def _snapshot(self):
        frame = {"filename": "/x/modeling_qwen2.py", "line": 88, "name": "forward"}
        return {"device_traces": [[{"action": "alloc", "addr": 1, "size": 3 * 2**20, "frames": [frame]}]]}


@pytest.mark.slow
def test_the_gpu_branch_runs_end_to_end_with_torch_cuda_stood_in(tmp_path, monkeypatch):
    """The GPU branch's own lines (its cases, CudaMeter's counters and allocation records, the plan for one GPU of the
    device's size, the whole step from max_memory_allocated, the offload saving and its judgement) on the CPU with a
    tiny model and short steps; the figures are the stand-in's, the point is that nothing breaks."""
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_check

    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(FIXTURES / "nvml" / "h200.json"))
    cuda = StandInCuda()
    small = ["data.batch_size=2", "rollout.n=2", "actor.ppo_epochs=1", "data.max_response_length=8",
             "actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
             "rollout.log_prob_micro_batch_size_per_gpu=4", "ref.log_prob_micro_batch_size_per_gpu=4"]
    rig = gpu_check.Rig(gpu=True, device="cpu", preset="cpu", cuda=cuda, extra=small)
    summary = gpu_check.run_checks(rig, ["nvml", "greedy", "plan", "offload"], tmp_path / "s.json")
    checks = summary["checks"]
    assert not [name for name, check in checks.items() if "error" in check], checks
    assert checks["nvml"]["status"] == "pass"  # the recorded H200's reading
    assert checks["greedy"]["float32"]["rows_equal_transformers"] == 8
    assert set(checks["plan"]["figures"]) >= {f"{case} whole step" for case in
                                              ("gpu-grpo", "gpu-grpo-builtin", "gpu-grpo-checkpointing", "gpu-ppo")}
    assert checks["plan"]["alive_at_peak"]["gpu-grpo rollout"] == ["3.0 MiB x 1 modeling_qwen2.py:88 forward"]
    assert "saving" in checks["offload"]["figures"] and "synchronize" in cuda.calls
    assert json.loads((tmp_path / "s.json").read_text())["checks"].keys() == checks.keys()

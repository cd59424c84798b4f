"""LoRA on our runtime, planned as verl_runtime/lora.py runs it: the frozen base as the actor loads it (fp32) beside
the adapters, gradients and AdamW state of the adapters only, the reference as the actor without its adapters (no
second model), one adapted matrix merged at a time for vLLM. The measured side: bench/plan_accuracy.py case lora
(weights, gradients and AdamW state equal to the byte; every phase and the whole step within 15% on the CPU)."""

import pytest
import yaml
from conftest import FIXTURES, REPO

from verl_deploy.plan import plan, preflight
from verl_deploy.plan.core import NO
from verl_deploy.plan.shape import model_shape
from verl_deploy.sizes import parse_gpus

QWEN7B = FIXTURES / "models" / "Qwen2.5-7B-Instruct"
GRPO = REPO / "examples" / "gsm8k-grpo.yaml"


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("VERL_DEPLOY_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))
    monkeypatch.setenv("VERL_DEPLOY_NVML_READING", str(FIXTURES / "nvml" / "no-driver.json"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _update(rank: int):
    result = plan(GRPO, [f"model.path={QWEN7B}", f"model.lora_rank={rank}"], gpus=parse_gpus("1"), gpu_type="H100",
                  read_data=False, with_suggestions=False)
    return result, {p.name: p for p in result.memory.phases}


def test_the_peak_depends_on_the_rank_and_only_the_adapters_train():
    shape = model_shape(str(QWEN7B))
    full, full_phases = _update(0)
    peaks = {}
    for rank in (8, 64):
        result, phases = _update(rank)
        adapters = shape.lora_params(rank)
        update = phases["actor update"].components
        assert update["gradients"] == 4 * adapters and update["optimizer"] == 8 * adapters
        assert update["weights"] == 4 * (shape.params + adapters)  # the frozen base and the adapters, no reference
        assert "without its LoRA adapters" in phases["reference log-probs"].detail
        assert any(note.startswith(f"LoRA rank {rank}:") for note in result.notes)
        peaks[rank] = result.peak_bytes
    assert peaks[8] < peaks[64] < full.peak_bytes
    assert full_phases["actor update"].components["optimizer"] == 8 * shape.params


def _published(name: str) -> list[str]:
    cases = yaml.safe_load((FIXTURES / "plan" / "verl_min_resources.yaml").read_text())["published"]
    return next(case["overrides"] for case in cases if case["name"] == name)


def test_verls_7b_lora_grpo_run_with_vllm_on_one_h100_passes_our_runtimes_preflight():
    """verl's published minimum: Qwen2.5-7B, GRPO with LoRA rank 32, vLLM at 0.2 of one H100, offload (its script's
    overrides, which our runtime reads with verl's keys). Planned as our runtime runs it, it fits at typical
    lengths; planned as full fine-tuning (the LoRA ignored, as before), it would be refused."""
    overrides = [f"actor_rollout_ref.model.path={QWEN7B}", "data.train_files=toy:letter", "trainer.device=cuda",
                 *_published("7B MIN GRPO-LoRA 1*H100 MaxBatch 16")]
    check = preflight(None, overrides, target="k8s", gpus=parse_gpus("1"), gpu_type="H100")
    assert check.status in ("fits", "tight") and not check.refuse, check.message
    full = preflight(None, [*overrides, "actor_rollout_ref.model.lora_rank=0"], target="k8s", gpus=parse_gpus("1"),
                     gpu_type="H100")
    assert full.refuse and full.status == NO

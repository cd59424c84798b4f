"""The C allocator keeps what a training step frees: the next step's activations reuse it without page faults."""

import platform
import resource

import pytest
import torch

from verl_runtime.allocator import keep_freed_memory


def _page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are glibc's")
def test_a_steps_freed_activations_are_reused_without_page_faults():
    assert keep_freed_memory()

    def step():  # 32 MB of activations, freed at the end, as a training step's are
        activations = [torch.ones(1024, 1024) for _ in range(8)]
        del activations

    step(), step()
    before = _page_faults()
    for _ in range(5):
        step()
    assert _page_faults() - before < 100  # glibc by default: about 8,000 here (its heap top back to the kernel)

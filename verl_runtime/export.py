"""A run's checkpoint as a Hugging Face model directory: config.json, safetensors shards, tokenizer files and
generation_config.json, which transformers' from_pretrained, vLLM and the Hub load.

The actor's weights come from checkpoints/step_<N>/state.pt (state["actor"]["model"]: the whole model's state_dict,
whatever the worker count or strategy that trained it); the optimizer stays behind. The architecture, tokenizer and
generation config come from the run's base model (model.path in the run's config.yaml). The directory is written
beside its destination and renamed into place, so a failure leaves nothing half-written.

The dtype written is the base model's own (its config's dtype: what a user of that model expects to load, e.g. bf16
for most Hub models), since the trainer keeps fp32 master weights whatever it computes in; `dtype` overrides it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import yaml

from verl_runtime import rundir
from verl_runtime.errors import UserError

DEFAULT_SHARD_SIZE = "5GB"  # transformers' own default: shards the Hub and vLLM load in parallel
# What a LoRA run's export writes: the merged model (loads like any model), or peft's adapter directory alone.
FORMS = ("merged", "adapter")


class ExportError(UserError):
    """A run or checkpoint that cannot be exported (the message says what to do)."""


def base_model_of(run_dir) -> str:
    """model.path of the run's config.yaml (the config the run last started with)."""
    path = Path(run_dir) / rundir.CONFIG_FILE
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return str(config["model"]["pretrained_model_name_or_path"])
    except FileNotFoundError:
        raise ExportError(f"{run_dir} has no {rundir.CONFIG_FILE}: it is not a run directory the trainer wrote "
                          "(point at runs/<run>)") from None
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ExportError(f"cannot read the model of {path} ({type(exc).__name__}): the run's config is damaged")


def pick_checkpoint(run_dir, step: int | None = None, deep: bool = True) -> tuple[int, Path]:
    """The checkpoint to export: step N (which must be complete), else the newest complete; deep: checksums too
    (the host's quick check before it starts the export passes False)."""
    run_dir = Path(run_dir)
    found = rundir.checkpoint_dirs(run_dir)
    if step is None:
        for number, path in reversed(found):
            if rundir.checkpoint_problem(path, deep) is None:
                return number, path
        if not found:
            raise ExportError(f"{run_dir} has no checkpoint yet: train at least one step (checkpoints are saved at the "
                              "end, every trainer.save_freq steps and when stopped)")
        raise ExportError(f"no usable checkpoint in {run_dir / rundir.CHECKPOINTS_DIR}: "
                          + "; ".join(f"{p.name}: {rundir.checkpoint_problem(p, deep)}" for _, p in found))
    path = dict(found).get(step)
    if path is None:
        there = ", ".join(str(n) for n, _ in found) or "none"
        raise ExportError(f"{run_dir} has no checkpoint of step {step}: the steps there are {there}")
    problem = rundir.checkpoint_problem(path, deep)
    if problem:
        raise ExportError(f"checkpoint {path} is unusable ({problem}): export another step (--step)")
    return step, path


def check_destination(out, replace: bool = False) -> Path:
    """out as a path to create: refused when it holds anything (unless replace) or is a file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file: name a new directory")
    if out.is_dir() and any(out.iterdir()) and not replace:
        raise ExportError(f"--out {out} exists and is not empty: name a new directory, or remove it first")
    return out


def export_checkpoint(run_dir, out=None, step: int | None = None, dtype: str | None = None,
                      max_shard_size: str | None = None, replace: bool = False, form: str = "merged") -> tuple[int, Path]:
    """Write checkpoint `step` (default: the newest usable) of run_dir as a Hugging Face model directory at out
    (None: the run's own hf/step_<N>, replaced: where the trainer's save_hf writes it, and where an export on a
    Kubernetes claim goes); returns (step, out). replace: an existing out is swapped for the new one.
    form: merged (a LoRA run's adapters folded into the weights), or adapter (peft's adapter files alone)."""
    from verl_runtime.models import resolve_dtype

    if form not in FORMS:
        raise ExportError(f"unknown export form {form!r}: choose one of {', '.join(FORMS)}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"no run directory {run_dir}: `verl-deploy runs` lists the runs")
    if out is not None:
        out = check_destination(out, replace)
    dtype = None if dtype in (None, "auto") else resolve_dtype(dtype, "cpu")  # a bad name fails before any work
    base = base_model_of(run_dir)
    step, checkpoint = pick_checkpoint(run_dir, step)
    if out is None:
        out, replace = run_dir / rundir.EXPORTS_DIR / rundir.step_dir_name(step), True
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise ExportError(f"cannot write beside {out} ({exc.strerror}): choose a writable --out") from None
    try:
        if form == "adapter":
            write_adapter(base, checkpoint, tmp)
        else:
            write_model_dir(base, checkpoint, tmp, dtype, max_shard_size or DEFAULT_SHARD_SIZE)
        _readable(tmp)
        if out.exists():  # empty, or replace was asked
            shutil.rmtree(out)
        tmp.rename(out)
    except OSError as exc:
        raise ExportError(f"cannot write {out} ({exc.strerror}): free space or choose another --out") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return step, out


def write_model_dir(base: str, checkpoint: Path, out: Path, dtype=None,
                    max_shard_size: str = DEFAULT_SHARD_SIZE) -> None:
    """The base model's architecture with the checkpoint's actor weights, its tokenizer and generation config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from verl_runtime.checkpoint import load_checkpoint
    from verl_runtime.models import _quiet_transformers, load_tokenizer, resolve_model_path

    _quiet_transformers()
    local = resolve_model_path(base)
    config = AutoConfig.from_pretrained(local)
    weights = actor_weights(load_checkpoint(checkpoint), checkpoint)
    target = dtype or _base_dtype(config)
    weights = _cast(weights, target)
    config.dtype = target
    with torch.device("meta"):  # the architecture alone: the weights given to save_pretrained are the checkpoint's
        model = AutoModelForCausalLM.from_config(config)
    expected = set(model.state_dict())
    missing, unexpected = expected - set(weights), set(weights) - expected
    if missing or unexpected:
        raise ExportError(f"{checkpoint} does not hold {base}'s weights (missing {sorted(missing)[:3]}, unexpected "
                          f"{sorted(unexpected)[:3]}): was model.path changed after the run?")
    try:
        model.generation_config = GenerationConfig.from_pretrained(local)
    except OSError:  # the base has none: the one derived from its config
        pass
    model.save_pretrained(out, state_dict=weights, safe_serialization=True, max_shard_size=max_shard_size)
    load_tokenizer(local).save_pretrained(out)


def actor_weights(state: dict, checkpoint: Path) -> dict:
    """The actor model's state_dict inside a trainer checkpoint (trainer.save: state["actor"]["model"]); a LoRA
    run's with its adapters merged in, under the base model's names."""
    try:
        weights = state["actor"]["model"]
    except (KeyError, TypeError):
        raise ExportError(f"{checkpoint} holds no actor weights: it is not a verl_runtime checkpoint") from None
    if state["actor"].get("lora"):
        from verl_runtime.lora import merged_weights

        return merged_weights(weights, state["actor"]["lora"])
    return dict(weights)


def write_adapter(base: str, checkpoint: Path, out: Path) -> None:
    """A LoRA run's adapters as peft saves them (adapter_model.safetensors, adapter_config.json)."""
    from verl_runtime.checkpoint import load_checkpoint
    from verl_runtime.lora import write_adapter_dir

    actor = load_checkpoint(checkpoint).get("actor") or {}
    if not actor.get("lora"):
        raise ExportError(f"{checkpoint} was trained without LoRA (model.lora_rank=0): it has no adapter; export "
                          "the whole model (--form merged)")
    write_adapter_dir(actor["model"], actor["lora"], base, out)


def _cast(weights: dict, dtype) -> dict:
    """Floating tensors in dtype; tensors that share storage (tied embeddings) still share it, so that
    save_pretrained writes a tied weight once."""
    done: dict[int, object] = {}
    cast = {}
    for name, tensor in weights.items():
        if not tensor.is_floating_point():
            cast[name] = tensor
            continue
        key = tensor.data_ptr()
        if key not in done:
            done[key] = tensor.to(dtype)
        cast[name] = done[key]
    return cast


def _readable(directory: Path) -> None:
    """The permissions of an ordinary new directory (mkdtemp's is 0700): the umask's, for whoever loads it."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _base_dtype(config):
    import torch

    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32

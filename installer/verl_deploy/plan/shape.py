"""The model's shape from its config.json alone: parameter counts, layers, widths, vocabulary.

Where the config.json comes from: a local model directory, `builtin:tiny` (verl_runtime.models builds it), or a Hub
id (`org/name[@revision]`) resolved through huggingface_hub's cache, fetching config.json only (a few KB;
HF_HUB_OFFLINE=1 answers from the cache alone). Never a table of model names.

How parameters are counted: transformers builds the model from the config on the meta device (no memory, no
weights) and every parameter is counted, for any architecture transformers knows. The result is kept in a small
cache keyed by the config's content, so later plans (and `run`'s pre-flight) need neither torch nor transformers.
Without transformers and without a cached count, the dense decoder families whose layout is plain arithmetic
(llama, mistral, qwen2, qwen3) are counted from config.json (tests hold it equal to the meta count); others need
transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verl_deploy.plan.errors import PlanError

BUILTIN_PREFIX = "builtin:"
# Decoder families whose parameters are plain arithmetic on config.json (attention q/k/v/o, gated MLP, RMSNorms).
ARITHMETIC_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
# The leaf names of MLP projections that make it gated (SwiGLU and kin): the activation keeps 4 widths, not 2.
_GATE_NAMES = {"gate_proj", "gate_up_proj", "w1", "w3", "fc_gate", "wi_0", "wi_1"}


@dataclass(frozen=True)
class Linear:
    """One kind of linear layer in the decoder layers (by its name inside a layer), e.g. self_attn.q_proj."""

    name: str
    in_features: int
    out_features: int
    count: int  # layers holding it
    bias: bool = False

    @property
    def weight_params(self) -> int:
        return self.in_features * self.out_features * self.count


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    architecture: str
    params: int  # every parameter, tied ones once
    layers: int
    layer_params: int  # the largest decoder layer's parameters (one FSDP unit)
    hidden: int
    intermediate: int  # MLP width a token goes through (MoE: experts per token x expert width, + shared)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # lm_head is the input embedding
    embed_params: int
    head_params: int  # lm_head's own parameters (0 when tied)
    linears: tuple[Linear, ...] = ()
    gated_mlp: bool = True
    counted_by: str = ""
    source: str = ""  # where config.json was read
    max_positions: int | None = None

    @property
    def root_params(self) -> int:
        """What sits outside the decoder layers: embeddings, final norm, lm_head (FSDP's root unit)."""
        return max(self.params - self.layers * self.layer_params, 0)

    @property
    def linear_weight_params(self) -> int:
        """Every matrix a matmul reads: the layers' linears and the lm_head (the tied embedding counts once)."""
        return sum(lin.weight_params for lin in self.linears) + self.vocab * self.hidden

    def linear_named(self, *suffixes: str) -> int:
        """Weight parameters of one layer's linears whose name ends with one of suffixes."""
        return sum(lin.in_features * lin.out_features for lin in self.linears
                   if lin.name.split(".")[-1] in suffixes)

    def lora_params(self, rank: int, targets: str | list[str] | tuple[str, ...] = "all-linear",
                    exclude: list[str] | tuple[str, ...] = ()) -> int:
        """Adapter parameters of LoRA rank `rank`: r x (in + out) for each targeted linear of the decoder layers
        (all-linear: every one, as PEFT's all-linear, which leaves the output layer out)."""
        if rank <= 0:
            return 0
        wanted = None if targets in ("all-linear", "all_linear", None) else set(
            [targets] if isinstance(targets, str) else targets)
        total = 0
        for lin in self.linears:
            leaf = lin.name.split(".")[-1]
            if wanted is not None and leaf not in wanted and lin.name not in wanted:
                continue
            if leaf in exclude or lin.name in exclude:
                continue
            total += rank * (lin.in_features + lin.out_features) * lin.count
        return total

    @property
    def critic_params(self) -> int:
        """A critic on this model: its backbone (lm_head dropped) and a value head hidden -> 1 (with bias)."""
        return self.params - self.head_params + self.hidden + 1

    def describe(self) -> str:
        count = (f"{self.params / 1e9:.2f}B" if self.params >= 1e9 else f"{self.params / 1e6:.1f}M"
                 if self.params >= 1e6 else f"{self.params:,}")
        return (f"{self.architecture} ({count} parameters: {self.layers} layers, hidden {self.hidden}, "
                f"MLP {self.intermediate}, {self.heads} heads / {self.kv_heads} KV heads of {self.head_dim}, "
                f"vocabulary {self.vocab:,}{', tied embeddings' if self.tied else ''})")

    def to_json(self) -> dict:
        data = asdict(self)
        data["linears"] = [asdict(lin) for lin in self.linears]
        return data

    @classmethod
    def from_json(cls, data: dict) -> ModelShape:
        data = dict(data)
        data["linears"] = tuple(Linear(**lin) for lin in data.get("linears", ()))
        return cls(**data)


# --- where config.json is -------------------------------------------------------------------------------------


@dataclass
class ConfigSource:
    config: dict[str, Any]
    folder: Path | None  # the local folder holding config.json (and maybe the tokenizer)
    name: str  # what the user named
    extra: dict = field(default_factory=dict)


def read_config(path: str, setting: str = "model.path") -> ConfigSource:
    """config.json of a local directory, builtin:tiny or a Hub id; PlanError (one line) otherwise. `setting`:
    the config key that named the model (a message says how to give a local folder through it)."""
    path = str(path)
    if path.startswith(BUILTIN_PREFIX):
        return _builtin(path)
    local = Path(path).expanduser()
    if local.is_dir():
        file = local / "config.json"
        if not file.is_file():
            raise PlanError(f"model directory {path} has no config.json: point model.path at a Hugging Face model "
                            "directory")
        return ConfigSource(_load_json(file), local, path)
    if local.is_file() and local.name.endswith(".json"):
        return ConfigSource(_load_json(local), local.parent, path)
    from verl_runtime.hub import HUB_ID, is_hub_id

    if not is_hub_id(path):
        raise PlanError(f"model {path} not found: give a local Hugging Face model directory (with config.json), a "
                        "Hub id (org/name or org/name@revision) or builtin:tiny")
    match = HUB_ID.match(path)
    file = _hub_config(match["repo"], match["revision"], setting)
    return ConfigSource(_load_json(file), file.parent, path)


def _load_json(file: Path) -> dict:
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read {file}: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{file} is not a model config (a JSON object)")
    return data


# verl_runtime.models' names for the built-in models and their caches (copied so that a plan whose count is cached
# imports no torch; tests/test_plan.py holds them equal). All have builtin:tiny's architecture and tokenizer
# (builtin:tiny-tools is its weights taught a tool call), so builtin:tiny's config.json and tokenizer stand for each.
BUILTIN_TINY = "builtin:tiny"
BUILTIN_CACHES = {BUILTIN_TINY: "builtin-tiny-v2", "builtin:tiny-tools": "builtin-tiny-tools-v1"}
TINY_CACHE_NAME = BUILTIN_CACHES[BUILTIN_TINY]


def _runtime_cache_root() -> Path:
    """verl_runtime.models.cache_root: $VERL_RUNTIME_CACHE, else ~/.cache/verl_runtime."""
    env = os.environ.get("VERL_RUNTIME_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "verl_runtime"


def _builtin(path: str) -> ConfigSource:
    if path not in BUILTIN_CACHES:
        raise PlanError(f"unknown built-in model {path!r}: the built-in models are {', '.join(BUILTIN_CACHES)}")
    folder = _runtime_cache_root() / TINY_CACHE_NAME
    if not (folder / "config.json").is_file():
        try:
            from verl_runtime.models import resolve_model_path
        except ImportError as exc:  # torch or transformers missing: builtin:tiny is built by them
            raise PlanError(f"{BUILTIN_TINY} is built on first use by torch and transformers, which are not "
                            f"installed here ({exc.name}): pip install 'verl-deploy[runtime]'") from None
        folder = Path(resolve_model_path(BUILTIN_TINY))
    return ConfigSource(_load_json(folder / "config.json"), folder, path)


# Seconds the one HEAD of config.json may take when the Hub is asked (HF_HUB_ETAG_TIMEOUT, when set, decides):
# the Hub answers a HEAD in well under a second; a network that swallows requests is known within seconds.
PROBE_TIMEOUT_S = 2.0
_FETCHED: dict[tuple, Path] = {}  # config.json files found in this process, by what was asked


def _hub_config(repo: str, revision: str | None, setting: str = "model.path") -> Path:
    """config.json of a Hub model through huggingface_hub (its cache, its offline mode), that file only.

    Where the Hub cannot be reached the answer is one line within seconds: huggingface_hub's hf_hub_download,
    whose first HEAD fails on a network without the Hub, asks again 5 times with back-off (~25 s, a log line each)
    when the file is not cached; so a file not in the cache is first asked for by one HEAD without retries, with a
    short timeout (a cached one falls back to the cache after one HEAD), with huggingface_hub quiet meanwhile."""
    try:
        from huggingface_hub import constants, hf_hub_download, hf_hub_url
        from huggingface_hub.errors import (
            EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        found = _cached_config(repo, revision)
        if found is None:
            raise PlanError(f"{repo} is not in the Hugging Face cache and huggingface_hub is not installed to fetch "
                            f"its config.json: pip install huggingface_hub, or {_local_hint(setting)}") from None
        return found
    where = repo + (f" at revision {revision}" if revision else "")
    cache = _hub_cache()  # the environment as it is now (huggingface_hub read it when first imported)
    offline = _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE") or constants.HF_HUB_OFFLINE
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    timeout = _probe_timeout()
    asked = (repo, revision, endpoint, str(cache), offline)
    if asked in _FETCHED and _FETCHED[asked].is_file():  # a plan reads config.json more than once: one request
        return _FETCHED[asked]
    try:
        with _quiet_hub():
            if not offline and _cached_config(repo, revision) is None:  # one HEAD, no retries: is the Hub there?
                _probe(hf_hub_url(repo, "config.json", revision=revision, endpoint=endpoint), endpoint, timeout)
            _FETCHED[asked] = Path(hf_hub_download(repo, "config.json", revision=revision, cache_dir=cache,
                                                   endpoint=endpoint, etag_timeout=timeout, local_files_only=offline))
            return _FETCHED[asked]
    except _Unreachable as exc:
        raise PlanError(_unreachable(endpoint, where, cache, setting, str(exc))) from None
    except GatedRepoError:
        raise PlanError(f"{repo} is a gated model: accept its terms on the Hub, then set HF_TOKEN") from None
    except RevisionNotFoundError:
        raise PlanError(f"{repo} has no revision {revision!r}: use a branch, tag or commit of it") from None
    except RepositoryNotFoundError:
        raise PlanError(f"{repo} is not a model on {endpoint}: check the id (a private one needs HF_TOKEN)") from None
    except LocalEntryNotFoundError:
        if offline:
            raise PlanError(f"{where}'s config.json is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE=1: "
                            f"fetch it once where the Hub is reachable (`hf download {repo} config.json`), or "
                            f"{_local_hint(setting)}") from None
        raise PlanError(_unreachable(endpoint, where, cache, setting, "no answer")) from None
    except EntryNotFoundError:
        raise PlanError(f"{where} has no config.json: it is not a transformers model") from None
    except (HfHubHTTPError, OSError) as exc:
        raise PlanError(f"cannot fetch {where}'s config.json: {_first_line(exc)}") from None


class _Unreachable(Exception):
    """The Hub did not answer the HEAD (a connection error or a timeout); the message says which."""


def _probe(url: str, endpoint: str, timeout: float) -> None:
    """One HEAD of config.json, without huggingface_hub's retries: an HTTP answer raises as huggingface_hub raises
    it (gated, not found, ...); no answer raises _Unreachable."""
    from huggingface_hub import get_hf_file_metadata
    from huggingface_hub.errors import HfHubHTTPError

    try:
        get_hf_file_metadata(url, timeout=timeout, endpoint=endpoint)  # retry_on_errors=False: a single request
    except HfHubHTTPError:
        raise
    except Exception as exc:  # httpx's connection errors and timeouts, as huggingface_hub lets them through
        if "timeout" in type(exc).__name__.lower():  # ReadTimeout, ConnectTimeout, ...
            raise _Unreachable(f"no answer in {timeout:g} s; HF_HUB_ETAG_TIMEOUT=10 waits longer") from None
        raise _Unreachable(_first_line(exc)) from None


def _unreachable(endpoint: str, where: str, cache: Path, setting: str, why: str) -> str:
    return (f"cannot reach {endpoint} for {where}'s config.json ({why}) and it is not in the Hugging Face cache "
            f"{cache}: {_local_hint(setting)}, or put it in that cache and set HF_HUB_OFFLINE=1 (or HF_ENDPOINT to a "
            "mirror this network reaches)")


def _local_hint(setting: str) -> str:
    return f"give a local path ({setting}=/path/to/model, the folder with its config.json)"


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _probe_timeout() -> float:
    try:
        return float(os.environ["HF_HUB_ETAG_TIMEOUT"])
    except (KeyError, ValueError):
        return PROBE_TIMEOUT_S


@contextmanager
def _quiet_hub():
    """While config.json is asked for: huggingface_hub's logger at ERROR and its warnings ignored (a plan's answer is
    its own one line), and its telemetry off: the user-agent header would first GET the Hub's list of AI agents
    (/api/agent-harnesses, 3 s of its own on a network that swallows requests), so config.json's requests are the
    only ones."""
    import logging
    import warnings

    from huggingface_hub import constants

    logger = logging.getLogger("huggingface_hub")
    level, telemetry = logger.level, constants.HF_HUB_DISABLE_TELEMETRY
    logger.setLevel(logging.ERROR)
    constants.HF_HUB_DISABLE_TELEMETRY = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
        constants.HF_HUB_DISABLE_TELEMETRY = telemetry


def _hub_cache() -> Path:
    """huggingface_hub's cache folder: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    return Path(os.environ.get("HF_HUB_CACHE", home / "hub")).expanduser()


def _cached_config(repo: str, revision: str | None) -> Path | None:
    """config.json in huggingface_hub's cache layout, read without huggingface_hub."""
    folder = _hub_cache() / ("models--" + repo.replace("/", "--"))
    ref = folder / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else revision
    candidate = folder / "snapshots" / (commit or "") / "config.json"
    return candidate if commit and candidate.is_file() else None


# --- counting -------------------------------------------------------------------------------------------------


def model_shape(path: str, setting: str = "model.path") -> ModelShape:
    """The shape of the model at `path` (see the module docstring); PlanError (one line) when it cannot be had.
    `setting`: the config key that named it (messages say how to give a local folder through it)."""
    source = read_config(path, setting)
    text_config = _text_config(source.config)
    key = _config_key(source.config)
    cached = _cache_get(key)
    if cached is not None:
        return _with_source(cached, source.name)  # counted before: no torch needed now
    try:
        shape = _count_on_meta(source)
    except ImportError as exc:
        shape = _count_by_arithmetic(text_config, source.config, missing=exc.name or "transformers")
    _cache_put(key, shape)
    return _with_source(shape, source.name)


def _with_source(shape: ModelShape, name: str) -> ModelShape:
    from dataclasses import replace

    return replace(shape, source=name)


def _text_config(config: dict) -> dict:
    """The language model's part of a multimodal config (text_config / llm_config), else the config itself."""
    for key in ("text_config", "llm_config", "language_config"):
        if isinstance(config.get(key), dict) and config[key].get("hidden_size"):
            return {**config[key], "model_type": config[key].get("model_type", config.get("model_type"))}
    return config


def _get(config: dict, *names: str, default=None):
    for name in names:
        if config.get(name) is not None:
            return config[name]
    return default


def _dims(config: dict) -> dict:
    """Widths from config.json, under the names the common architectures use."""
    hidden = _get(config, "hidden_size", "n_embd", "d_model", "dim")
    if not hidden:
        raise PlanError(f"config.json of model type {config.get('model_type')!r} names no hidden size "
                        "(hidden_size, n_embd, d_model): it is not a language model this planner reads")
    layers = _get(config, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    heads = _get(config, "num_attention_heads", "n_head", "num_heads")
    kv_heads = _get(config, "num_key_value_heads", "multi_query_group_num", "num_kv_heads", default=heads)
    head_dim = _get(config, "head_dim", default=None) or (hidden // heads if heads else None)
    intermediate = _get(config, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", default=None) or 4 * hidden
    experts_per_token = _get(config, "num_experts_per_tok", "moe_topk", "top_k_experts")
    expert_width = _get(config, "moe_intermediate_size", "expert_intermediate_size")
    if experts_per_token and expert_width:
        intermediate = experts_per_token * expert_width + (_get(config, "shared_expert_intermediate_size", default=0) or 0)
    return {"hidden": int(hidden), "layers": int(layers or 0), "heads": int(heads or 1), "kv_heads": int(kv_heads or 1),
            "head_dim": int(head_dim or hidden), "intermediate": int(intermediate),
            "vocab": int(_get(config, "vocab_size", "padded_vocab_size", default=0)),
            "tied": bool(config.get("tie_word_embeddings", True)),
            "max_positions": _get(config, "max_position_embeddings", "n_positions", "seq_length")}


def _count_on_meta(source: ConfigSource) -> ModelShape:
    """Build the model from its config on the meta device and count. ImportError when transformers is missing."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    from verl_runtime.models import _quiet_transformers

    _quiet_transformers()
    transformers.logging.set_verbosity_error()
    try:
        config = AutoConfig.for_model(**source.config) if "model_type" in source.config else None
        if config is None:
            raise ValueError("config.json has no model_type")
    except (ValueError, KeyError) as exc:
        raise PlanError(f"transformers {transformers.__version__} does not know this model's config "
                        f"({_first_line(exc)}): upgrade transformers, or give a model it knows") from None
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError, RuntimeError, AttributeError, NotImplementedError) as exc:
        raise PlanError(f"transformers {transformers.__version__} has no causal LM for model type "
                        f"{config.model_type!r} ({_first_line(exc)})") from None
    params = sum(p.numel() for p in model.parameters())
    text = _text_config(source.config)
    dims = _dims(text)
    layer_list = _decoder_layers(model, dims["layers"])
    layer_params = max((sum(p.numel() for p in layer.parameters()) for layer in layer_list), default=0)
    linears = _linears(layer_list)
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight
    embed_params = embed.weight.numel() if embed is not None else 0
    head_params = 0 if tied or head is None else sum(p.numel() for p in head.parameters())
    vocab = (head.weight.shape[0] if head is not None else None) or dims["vocab"]
    names = {lin.name.split(".")[-1] for lin in linears}
    return ModelShape(
        model_type=str(config.model_type), architecture=type(model).__name__, params=int(params),
        layers=len(layer_list) or dims["layers"], layer_params=int(layer_params), hidden=dims["hidden"],
        intermediate=dims["intermediate"], heads=dims["heads"], kv_heads=dims["kv_heads"], head_dim=dims["head_dim"],
        vocab=int(vocab), tied=bool(tied), embed_params=int(embed_params), head_params=int(head_params),
        linears=linears, gated_mlp=bool(names & _GATE_NAMES) if linears else True,
        counted_by=f"parameters counted on the meta device by transformers {transformers.__version__}", max_positions=dims["max_positions"],
    )


def _decoder_layers(model, layers: int) -> list:
    """The decoder layers: the ModuleList of num_hidden_layers blocks holding the most parameters."""
    from torch import nn

    best: list = []
    best_params = -1
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == layers and layers:
            count = sum(p.numel() for p in module.parameters())
            if count > best_params:
                best, best_params = list(module), count
    return best


def _linears(layer_list: list) -> tuple[Linear, ...]:
    """The linear layers (nn.Linear, and GPT-2's Conv1D) of the decoder layers, aggregated by name."""
    from torch import nn

    found: dict[str, list[int]] = {}
    for layer in layer_list:
        for name, module in layer.named_modules():
            if isinstance(module, nn.Linear):
                dims = (module.in_features, module.out_features, module.bias is not None)
            elif type(module).__name__ == "Conv1D" and hasattr(module, "nf"):
                dims = (module.weight.shape[0], module.nf, module.bias is not None)
            else:
                continue
            entry = found.setdefault(name, [*dims, 0])
            entry[3] += 1
    return tuple(Linear(name, i, o, count, bool(bias)) for name, (i, o, bias, count) in found.items())


def _count_by_arithmetic(config: dict, full_config: dict, missing: str) -> ModelShape:
    """The dense decoder families' parameters from config.json: embeddings, per layer q/k/v/o (+ biases where the
    family has them) and a gated MLP and two RMSNorms (+ q/k norms in qwen3), final norm, lm_head unless tied."""
    model_type = str(config.get("model_type", ""))
    if model_type not in ARITHMETIC_FAMILIES:
        raise PlanError(f"counting the parameters of a {model_type or 'model of unknown type'} model needs "
                        f"transformers ({missing} is not installed here): pip install 'verl-deploy[runtime]', or "
                        "plan once where it is installed (the count is cached)")
    d = _dims(config)
    h, i, q_out = d["hidden"], d["intermediate"], d["heads"] * d["head_dim"]
    kv_out = d["kv_heads"] * d["head_dim"]
    attention_bias = model_type == "qwen2" or bool(config.get("attention_bias"))
    mlp_bias = bool(config.get("mlp_bias"))
    linears = (
        Linear("self_attn.q_proj", h, q_out, d["layers"], attention_bias),
        Linear("self_attn.k_proj", h, kv_out, d["layers"], attention_bias),
        Linear("self_attn.v_proj", h, kv_out, d["layers"], attention_bias),
        Linear("self_attn.o_proj", q_out, h, d["layers"], bool(config.get("attention_bias")) and model_type != "qwen2"),
        Linear("mlp.gate_proj", h, i, d["layers"], mlp_bias),
        Linear("mlp.up_proj", h, i, d["layers"], mlp_bias),
        Linear("mlp.down_proj", i, h, d["layers"], mlp_bias),
    )
    per_layer = sum(lin.in_features * lin.out_features + (lin.out_features if lin.bias else 0) for lin in linears)
    per_layer += 2 * h + (2 * d["head_dim"] if model_type == "qwen3" else 0)
    embed = d["vocab"] * h
    head = 0 if d["tied"] else d["vocab"] * h
    params = embed + d["layers"] * per_layer + h + head
    return ModelShape(
        model_type=model_type, architecture=(full_config.get("architectures") or [model_type])[0], params=params,
        layers=d["layers"], layer_params=per_layer, hidden=h, intermediate=i, heads=d["heads"],
        kv_heads=d["kv_heads"], head_dim=d["head_dim"], vocab=d["vocab"], tied=d["tied"], embed_params=embed,
        head_params=head, linears=linears, gated_mlp=True,
        counted_by=f"parameters counted from config.json (the {model_type} layout; {missing} is not installed here)",
        max_positions=d["max_positions"],
    )


# --- the count cache ------------------------------------------------------------------------------------------


def _config_key(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:32]


def cache_dir() -> Path:
    """Where counts are kept: $VERL_DEPLOY_CACHE, else ~/.cache/verl-deploy."""
    root = os.environ.get("VERL_DEPLOY_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "verl-deploy"
    return Path(root).expanduser() / "model-shapes"


def _cache_get(key: str) -> ModelShape | None:
    file = cache_dir() / f"{key}.json"
    try:
        return ModelShape.from_json(json.loads(file.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _cache_put(key: str, shape: ModelShape) -> None:
    if "meta device" not in shape.counted_by:
        return  # only exact counts are kept
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(shape.to_json()))
        tmp.replace(folder / f"{key}.json")
    except OSError:
        pass  # a read-only home: the count is made again next time


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__

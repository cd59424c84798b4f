"""The decode path a GPU runs: the engine's own copy of a Llama-family model's weights in the compute dtype, a
static KV cache per batch-size bucket, and the whole decode step (the layers, then sampling) captured once as a CUDA
graph and replayed for every new token.

At a GPU's batch sizes a decode step is a few hundred small kernels whose launch costs more than their arithmetic;
replayed from a graph, they cost what the GPU takes to run them. Everything the step reads lives at fixed addresses:
the weights (refreshed in place after each update), the KV slabs, the rotary tables, the mask and the random draws of
every step (drawn before the loop from the run's seeded generator); the step writes its token and log-prob into the
rows of output buffers that a step counter on the device picks.

The arithmetic follows transformers' modules under autocast, which is how the trainer computes its log-probs: the
residual stream in fp32, RMSNorm in fp32 with its weight, each linear's input cast to the compute dtype, rotary in
fp32, keys and values stored in the compute dtype, the softmax in fp32. On the CPU in fp32 it gives transformers'
greedy tokens (tests/test_rollout_graph.py), where the CUDA graph stands in as an eager call of the same step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from verl_runtime.lean_model import prompt_attention_mask
from verl_runtime.models import position_ids_from_mask
from verl_runtime.rollout.sampling import sample

BATCH_BUCKET = 8  # rows are padded up to multiples of it, so a run captures a handful of graphs, not one per call
LENGTH_BUCKET = 128  # slots of the KV cache likewise
CHECK_EVERY = 8  # steps between looks (a device-to-host sync) at whether every row has finished
KEEP = 2  # decoders (KV cache and graph) kept per engine: the training batch's and the validation's


class DecodeWeights(nn.Module):
    """A model's weights as the decode step reads them, in the compute dtype (norms in fp32): q/k/v and gate/up each
    stacked into one matrix. Buffers, not parameters: they move with Module.to (offload) and are never trained;
    refresh() copies a model's current weights in, in place, so addresses a captured graph holds stay valid."""

    def __init__(self, model, dtype: torch.dtype, device: torch.device):
        super().__init__()
        core = model.model
        attention = core.layers[0].self_attn
        self.heads, self.kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
        self.head_dim, self.scale = attention.head_dim, attention.scaling
        self.tied = model.lm_head.weight is core.embed_tokens.weight
        self.eps = [layer.input_layernorm.variance_epsilon for layer in core.layers] + [core.norm.variance_epsilon]
        self.rotary = core.rotary_emb  # the model's own: every rope variant whose frequencies do not grow with length
        with torch.no_grad():
            for name, tensor in _layout(model).items():
                norm = name.endswith("norm")
                self.register_buffer(name, tensor.detach().to(device, torch.float32 if norm else dtype),
                                     persistent=False)
        self.layers = len(core.layers)

    @torch.no_grad()
    def refresh(self, model) -> None:
        """Copy a model's current weights in, or a whole state dict's (transformers' names, as FSDP gathers them)."""
        layout = _layout_of_state(model, self.layers, self.tied) if isinstance(model, dict) else _layout(model)
        for name, tensor in layout.items():
            getattr(self, name).copy_(tensor)

    def get(self, name: str) -> torch.Tensor | None:
        return getattr(self, name, None)

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    @property
    def lm_head(self) -> torch.Tensor:
        return self.embedding if self.tied else self.get("output")


def _layout(model) -> dict[str, torch.Tensor]:
    """Name -> the tensor (stacked where the step does one matmul) a model's weights give, in its own dtype."""
    core = model.model
    out = {"embedding": core.embed_tokens.weight, "final_norm": core.norm.weight}
    if model.lm_head.weight is not core.embed_tokens.weight:
        out["output"] = model.lm_head.weight
    for i, layer in enumerate(core.layers):
        attention, mlp = layer.self_attn, layer.mlp
        projections = (attention.q_proj, attention.k_proj, attention.v_proj)
        out[f"l{i}_input_norm"] = layer.input_layernorm.weight
        out[f"l{i}_qkv"] = torch.cat([p.weight for p in projections])
        if attention.q_proj.bias is not None:
            out[f"l{i}_qkv_bias"] = torch.cat([p.bias for p in projections])
        out[f"l{i}_o"] = attention.o_proj.weight
        if attention.o_proj.bias is not None:
            out[f"l{i}_o_bias"] = attention.o_proj.bias
        out[f"l{i}_post_norm"] = layer.post_attention_layernorm.weight
        out[f"l{i}_gate_up"] = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        if mlp.gate_proj.bias is not None:
            out[f"l{i}_gate_up_bias"] = torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias])
        out[f"l{i}_down"] = mlp.down_proj.weight
        if mlp.down_proj.bias is not None:
            out[f"l{i}_down_bias"] = mlp.down_proj.bias
    return out


def _layout_of_state(state: dict[str, torch.Tensor], layers: int, tied: bool) -> dict[str, torch.Tensor]:
    """_layout from a causal LM's state dict (model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...)."""
    def get(name):
        return state.get(name)

    out = {"embedding": state["model.embed_tokens.weight"], "final_norm": state["model.norm.weight"]}
    if not tied:
        out["output"] = state["lm_head.weight"]
    for i in range(layers):
        prefix = f"model.layers.{i}."
        attention, mlp = prefix + "self_attn.", prefix + "mlp."
        out[f"l{i}_input_norm"] = state[prefix + "input_layernorm.weight"]
        out[f"l{i}_qkv"] = torch.cat([state[f"{attention}{p}_proj.weight"] for p in "qkv"])
        if get(attention + "q_proj.bias") is not None:
            out[f"l{i}_qkv_bias"] = torch.cat([state[f"{attention}{p}_proj.bias"] for p in "qkv"])
        out[f"l{i}_o"] = state[attention + "o_proj.weight"]
        if get(attention + "o_proj.bias") is not None:
            out[f"l{i}_o_bias"] = state[attention + "o_proj.bias"]
        out[f"l{i}_post_norm"] = state[prefix + "post_attention_layernorm.weight"]
        out[f"l{i}_gate_up"] = torch.cat([state[mlp + "gate_proj.weight"], state[mlp + "up_proj.weight"]])
        if get(mlp + "gate_proj.bias") is not None:
            out[f"l{i}_gate_up_bias"] = torch.cat([state[mlp + "gate_proj.bias"], state[mlp + "up_proj.bias"]])
        out[f"l{i}_down"] = state[mlp + "down_proj.weight"]
        if get(mlp + "down_proj.bias") is not None:
            out[f"l{i}_down_bias"] = state[mlp + "down_proj.bias"]
    return out


@dataclass(frozen=True)
class Bucket:
    rows: int  # padded
    slots: int  # KV cache length, padded
    sampling: tuple  # (do_sample, temperature, top_k, top_p): baked into the captured step
    eos: tuple[int, ...]

    @classmethod
    def of(cls, rows: int, total: int, params, eos_ids) -> Bucket:
        return cls(_round_up(rows, BATCH_BUCKET), _round_up(total, LENGTH_BUCKET),
                   (params.do_sample, params.temperature, params.top_k, params.top_p), tuple(eos_ids))


class GraphDecoder:
    """One bucket's static state and its captured step. reset() takes a call's prompts (prefill, tables, draws);
    run() decodes up to max_new_tokens, replaying the step."""

    def __init__(self, weights: DecodeWeights, bucket: Bucket, params, device: torch.device, graphs: Graphs):
        self.weights, self.bucket, self.params, self.device = weights, bucket, params, device
        w, rows, slots = weights, bucket.rows, bucket.slots
        self.keys = [torch.zeros(rows, w.kv_heads, slots, w.head_dim, dtype=w.dtype, device=device)
                     for _ in range(w.layers)]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.cos = torch.zeros(rows, slots, w.head_dim, device=device)
        self.sin = torch.zeros_like(self.cos)
        self.visible = torch.zeros(rows, slots, dtype=torch.bool, device=device)  # the real prompt tokens
        self.slots = torch.arange(slots, device=device)
        self.prompt_length = torch.zeros(1, dtype=torch.long, device=device)
        self.cursor = torch.zeros(1, dtype=torch.long, device=device)  # the slot the next step writes
        self.t = torch.zeros(1, dtype=torch.long, device=device)  # the index of the token the next step samples
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)  # the last sampled token of each row
        self.draws = torch.zeros(slots, rows, 1, dtype=torch.float64, device=device)
        self.out_tokens = torch.zeros(slots, rows, dtype=torch.long, device=device)
        self.out_log_probs = torch.zeros(slots, rows, device=device)
        self.finished = torch.zeros(rows, dtype=torch.bool, device=device)
        self.eos = torch.tensor(bucket.eos, device=device)
        self.graph = graphs.capture(self.step, self._counters)

    # --- one call ------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def reset(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, repeats: int, max_new_tokens: int,
              generator) -> None:
        """Prefill the call's prompts (each distinct one once: rows come in groups of `repeats` samples of one
        prompt), fill the tables and draw every step's random numbers, as the eager path draws them. Rows beyond the
        call's are copies of its first (a real prompt: an all-padding row would make NaN attention)."""
        rows, length = prompt_ids.shape
        extra = self.bucket.rows - rows
        padded_mask = torch.cat([prompt_mask, prompt_mask[:1].expand(extra, -1)])
        positions = position_ids_from_mask(padded_mask)
        steps = torch.arange(1, self.bucket.slots - length + 1, device=self.device)
        cos, sin = self._rotation(torch.cat([positions, positions[:, -1:] + steps], dim=1))
        self.cos.copy_(cos)
        self.sin.copy_(sin)
        self.visible.zero_()[:, :length] = padded_mask.bool()
        self.prompt_length.fill_(length)
        self.cursor.fill_(length)
        self.t.fill_(1)
        self.finished.zero_()
        self.draws[:max_new_tokens, :rows] = torch.rand(max_new_tokens, rows, 1, dtype=torch.float64,
                                                        device=self.device, generator=generator)
        owner = torch.cat([torch.arange(rows, device=self.device) // repeats,
                           torch.zeros(extra, dtype=torch.long, device=self.device)])
        firsts = torch.arange(0, rows, repeats, device=self.device)
        logits = self._prefill(prompt_ids[firsts], prompt_mask[firsts], firsts, owner, length)
        first, log_prob = sample(logits.float(), self.params, self.draws[0])
        self.out_tokens[0] = first
        self.out_log_probs[0] = log_prob
        self.tokens.copy_(first)
        self.finished |= torch.isin(first, self.eos)

    def run(self, rows: int, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and log-probs [rows, steps] of the call's rows: steps up to max_new_tokens, fewer when every row
        has reached an EOS (looked at every CHECK_EVERY steps; later tokens of a finished row are masked out by the
        caller, as with the eager path)."""
        done = 1
        while done < max_new_tokens:
            self.graph.replay()
            done += 1
            if done % CHECK_EVERY == 0 and bool(self.finished[:rows].all()):
                break
        return self.out_tokens[:done, :rows].t(), self.out_log_probs[:done, :rows].t()

    # --- the captured step ---------------------------------------------------------------------------------------

    def step(self) -> None:
        """Feed each row's last token at the cursor, sample the next: its token and log-prob into the output rows at
        t, then the counters on by one. No host synchronisation and no allocation outside the graph's pool."""
        w, cursor = self.weights, self.cursor
        cos, sin = self.cos.index_select(1, cursor)[:, None], self.sin.index_select(1, cursor)[:, None]  # [B, 1, 1, d]
        sees = self.visible | ((self.slots >= self.prompt_length) & (self.slots <= cursor))
        bias = torch.zeros(sees.shape, device=self.device).masked_fill_(~sees, -float("inf"))[:, None, None]
        hidden = F.embedding(self.tokens, w.embedding).float()[:, None]  # [B, 1, D]
        for i in range(w.layers):
            q, k, v = _project(w, i, hidden, cos, sin)
            self.keys[i].index_copy_(2, cursor, k)
            self.values[i].index_copy_(2, cursor, v)
            hidden = _finish(w, i, hidden, _attend(w, q, self.keys[i], self.values[i], bias))
        logits = F.linear(_rms_norm(hidden, w.final_norm, w.eps[-1]).to(w.dtype), w.lm_head)[:, -1]
        token, log_prob = sample(logits.float(), self.params, self.draws.index_select(0, self.t)[0])
        self.out_tokens.index_copy_(0, self.t, token[None])
        self.out_log_probs.index_copy_(0, self.t, log_prob[None])
        self.finished |= torch.isin(token, self.eos)
        self.tokens.copy_(token)
        cursor += 1
        self.t += 1

    def _counters(self) -> list[torch.Tensor]:
        """What a step changes besides the slots it writes (restored after the warm-up run before capture)."""
        return [self.cursor, self.t, self.tokens, self.finished]

    # --- the prefill ---------------------------------------------------------------------------------------------

    def _prefill(self, prompt_ids, prompt_mask, firsts, owner, length: int) -> torch.Tensor:
        """The distinct prompts (the rows `firsts`): their keys and values into the slots of every row they own, and
        the logits [rows, V] of the last prompt position, per row."""
        w = self.weights
        cos = self.cos[firsts, :length][:, None]
        sin = self.sin[firsts, :length][:, None]
        sees = prompt_attention_mask(prompt_mask)  # [N, 1, P, P]
        bias = torch.zeros(sees.shape, device=self.device).masked_fill_(~sees, -float("inf"))
        hidden = F.embedding(prompt_ids, w.embedding).float()
        for i in range(w.layers):
            q, k, v = _project(w, i, hidden, cos, sin)
            self.keys[i][:, :, :length] = k.index_select(0, owner)
            self.values[i][:, :, :length] = v.index_select(0, owner)
            hidden = _finish(w, i, hidden, _attend(w, q, k, v, bias))
        last = _rms_norm(hidden[:, -1:], w.final_norm, w.eps[-1]).to(w.dtype)
        return F.linear(last, w.lm_head)[:, -1].index_select(0, owner)

    def _rotation(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [B, L, d] in fp32 from the model's own rotary module, wherever its tables live."""
        rotary = self.weights.rotary
        home = rotary.inv_freq.device
        probe = torch.zeros((), device=home)  # rotary reads only its dtype and device
        cos, sin = rotary(probe, positions.to(home))
        return cos.to(self.device), sin.to(self.device)


# --- the block maths, as transformers' Llama-family modules compute them under autocast ---------------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _linear(w: DecodeWeights, x: torch.Tensor, name: str) -> torch.Tensor:
    return F.linear(x.to(w.dtype), w.get(name), w.get(name + "_bias"))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _project(w: DecodeWeights, i: int, hidden: torch.Tensor, cos, sin):
    """Queries [B, heads, L, d] (fp32, rotated), keys and values [B, kv_heads, L, d] (compute dtype) of hidden."""
    rows, length, _ = hidden.shape
    qkv = _linear(w, _rms_norm(hidden, w.get(f"l{i}_input_norm"), w.eps[i]), f"l{i}_qkv")
    qkv = qkv.view(rows, length, -1, w.head_dim).transpose(1, 2)
    q, k, v = qkv.split([w.heads, w.kv_heads, w.kv_heads], dim=1)
    q = q * cos + _rotate_half(q) * sin  # fp32, as the fp32 rotary tables make them
    k = k * cos + _rotate_half(k) * sin
    return q, k.to(w.dtype), v


def _attend(w: DecodeWeights, q, keys, values, bias) -> torch.Tensor:
    """Attention [B, L, heads * d] of queries over keys and values [B, kv_heads, S, d]; bias [B, 1, L, S] additive.
    The query heads of one kv head attend as one batched matmul; the softmax in fp32."""
    rows, _, length, _ = q.shape
    groups = w.heads // w.kv_heads
    q = q.to(w.dtype).reshape(rows, w.kv_heads, groups * length, w.head_dim)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float() * w.scale  # [B, kv, groups * L, S]
    scores = scores.view(rows, w.kv_heads, groups, length, -1) + bias[:, :, None]
    probs = scores.softmax(dim=-1).to(w.dtype).view(rows, w.kv_heads, groups * length, -1)
    attended = torch.matmul(probs, values).view(rows, w.heads, length, w.head_dim)
    return attended.transpose(1, 2).reshape(rows, length, -1)


def _finish(w: DecodeWeights, i: int, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    hidden = hidden + _linear(w, attended, f"l{i}_o")
    gate, up = _linear(w, _rms_norm(hidden, w.get(f"l{i}_post_norm"), w.eps[i]), f"l{i}_gate_up").chunk(2, dim=-1)
    return hidden + _linear(w, F.silu(gate) * up, f"l{i}_down")


# --- capture ------------------------------------------------------------------------------------------------------


class Graphs:
    """Captures a step as a CUDA graph (torch.cuda). `cuda` is torch.cuda; the CPU tests hand in a stand-in with the
    same names, so that this code runs in CI; without `cuda` (the CPU) a "graph" is the step called eagerly."""

    def __init__(self, device: torch.device, cuda=None):
        self.device = device
        self.cuda = cuda if cuda is not None else (torch.cuda if device.type == "cuda" else None)

    def capture(self, step, counters) -> object:
        if self.cuda is None:
            return _Eager(step)
        cuda = self.cuda
        saved = [c.clone() for c in counters()]
        side = cuda.Stream(self.device)
        side.wait_stream(cuda.current_stream(self.device))
        with cuda.stream(side):  # one run first: libraries set up their handles and workspaces outside the graph
            step()
        cuda.current_stream(self.device).wait_stream(side)
        for counter, value in zip(counters(), saved):
            counter.copy_(value)
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            step()
        return graph


class _Eager:
    def __init__(self, step):
        self.replay = step


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple

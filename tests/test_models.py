"""Models: builtin:tiny is built offline and cached; any local HF causal LM loads; log-probs are recomputed exactly."""

import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from verl_runtime.errors import ModelError
from verl_runtime.models import (
    BUILTIN_TINY,
    TINY_CACHE_NAME,
    build_tiny_model,
    default_dtype,
    load_causal_lm,
    load_tokenizer,
    load_value_model,
    position_ids_from_mask,
    resolve_model_path,
    response_log_probs,
    response_values,
)


def test_builtin_tiny_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_RUNTIME_CACHE", str(tmp_path))
    # A temp dir left behind by a crashed build must not be mistaken for the model.
    (tmp_path / f".{TINY_CACHE_NAME}.tmp-crashed").mkdir()

    first = resolve_model_path(BUILTIN_TINY)
    stamp = (tmp_path / TINY_CACHE_NAME / "model.safetensors").stat().st_mtime_ns
    again = resolve_model_path(BUILTIN_TINY)

    assert first == again == str(tmp_path / TINY_CACHE_NAME)
    assert (tmp_path / TINY_CACHE_NAME / "model.safetensors").stat().st_mtime_ns == stamp
    model = AutoModelForCausalLM.from_pretrained(first)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 2)
    assert (model.config.num_attention_heads, model.config.num_key_value_heads) == (2, 1)  # head_dim 32, for vLLM
    assert model.config.tie_word_embeddings and model.config.max_position_embeddings == 1024


def test_concurrent_builds_leave_one_complete_model(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_RUNTIME_CACHE", str(tmp_path))
    results = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model_path(BUILTIN_TINY))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [str(tmp_path / TINY_CACHE_NAME)] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [TINY_CACHE_NAME]
    assert load_tokenizer(BUILTIN_TINY).decode(load_tokenizer(BUILTIN_TINY).encode("ok")) == "ok"


def test_tiny_weights_are_seeded(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "a", seed=3)).state_dict()
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "b", seed=3)).state_dict()
    c = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "c", seed=4)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


@pytest.mark.parametrize(
    "text",
    [
        "Natalia sold clips to 48 of her friends in April.\n#### 72",
        "  leading spaces, tabs\t and \r\n line ends ~`!@#$%^&*()_+{}|:\"<>?[];',./\\",
        "unicode: € — ü 数学 😀",
        "<|im_start|>user\nhi<|im_end|>\n",
    ],
)
def test_tiny_tokenizer_round_trips_text(tiny_model_dir, text):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_tiny_tokenizer_specials_and_chat_template(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert len(tokenizer.encode("<|im_start|>")) == 1
    # Printable ASCII is one token per character, so lengths are predictable.
    assert len(tokenizer.encode("What is 12 + 30?")) == len("What is 12 + 30?")
    prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_missing_or_invalid_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match=r"model directory .*nope not found: set model.path"):
        resolve_model_path(str(tmp_path / "nope"))
    with pytest.raises(ModelError, match="has no config.json"):
        load_causal_lm(str(tmp_path), None, "cpu")
    with pytest.raises(ModelError, match="unknown built-in model"):
        resolve_model_path("builtin:huge")


def test_unwritable_cache_says_which_setting_to_change(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("VERL_RUNTIME_CACHE", str(blocker / "cache"))
    with pytest.raises(ModelError, match="set VERL_RUNTIME_CACHE to a writable directory"):
        resolve_model_path(BUILTIN_TINY)


def test_dtype_defaults_and_loading_on_cpu(tiny_opt_dir):
    assert default_dtype("cuda") == torch.bfloat16
    assert default_dtype("cpu") == torch.float32
    model = load_causal_lm(tiny_opt_dir, None, "cpu")
    assert type(model).__name__ == "OPTForCausalLM"
    assert next(model.parameters()).dtype == torch.float32
    assert load_causal_lm(tiny_opt_dir, "bf16", "cpu").dtype == torch.bfloat16


def test_gradient_checkpointing_trains(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, None, "cpu", gradient_checkpointing=True)
    model.train()
    assert model.is_gradient_checkpointing
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    mask = torch.ones_like(ids)
    log_probs, _ = response_log_probs(model, ids, mask, position_ids_from_mask(mask), response_length=3)
    log_probs.sum().backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_position_ids_ignore_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def _left_padded_batch(prompts, responses, pad_id):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p + r for p, r in zip(prompts, responses)])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + len(r)) for p, r in zip(prompts, responses)])
    return ids, mask


@pytest.mark.parametrize("model_dir", ["tiny_model_dir", "tiny_opt_dir"])
def test_left_padded_log_probs_equal_unpadded_forward(model_dir, request):
    path = request.getfixturevalue(model_dir)
    model, tokenizer = load_causal_lm(path, None, "cpu"), load_tokenizer(path)
    prompts = [tokenizer.encode("Q: 1+1?\nA:"), tokenizer.encode("Hi"), tokenizer.encode("A longer prompt, padded less")]
    responses = [tokenizer.encode(" two!"), tokenizer.encode(" yo!<|im_end|>"), tokenizer.encode(" ok.A")]
    ids, mask = _left_padded_batch(prompts, responses, tokenizer.pad_token_id)

    with torch.no_grad():
        batched, _ = response_log_probs(model, ids, mask, position_ids_from_mask(mask), response_length=5)
        for row, (prompt, response) in enumerate(zip(prompts, responses)):
            single = torch.tensor([prompt + response])
            alone, _ = response_log_probs(
                model, single, torch.ones_like(single), torch.arange(single.shape[1])[None], response_length=5
            )
            torch.testing.assert_close(batched[row], alone[0], atol=1e-5, rtol=0)


def test_temperature_scales_logits_like_the_sampler(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, None, "cpu")
    ids = torch.tensor([[10, 20, 30, 40, 50, 60, 70]])
    mask = torch.ones_like(ids)
    positions = position_ids_from_mask(mask)
    temperature = 0.6
    with torch.no_grad():
        log_probs, entropy = response_log_probs(
            model, ids, mask, positions, response_length=4, temperature=temperature, with_entropy=True
        )
        full_logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    expected = torch.log_softmax(full_logits[:, -5:-1] / temperature, dim=-1)
    torch.testing.assert_close(log_probs, expected.gather(-1, ids[:, -4:, None]).squeeze(-1), atol=1e-5, rtol=0)
    expected_entropy = -(expected.exp() * expected).sum(-1)
    torch.testing.assert_close(entropy, expected_entropy, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_dir", ["tiny_model_dir", "tiny_opt_dir"])
def test_value_model_scores_every_position(model_dir, request):
    critic = load_value_model(request.getfixturevalue(model_dir), None, "cpu")
    ids = torch.tensor([[0, 0, 11, 12, 13, 14], [21, 22, 23, 24, 25, 26]])
    mask = (ids != 0).long()
    values = critic(ids, mask, position_ids_from_mask(mask))
    assert values.shape == (2, 6) and values.dtype == torch.float32
    assert response_values(critic, ids, mask, position_ids_from_mask(mask), response_length=3).shape == (2, 3)
    values.sum().backward()
    assert critic.value_head.weight.grad is not None

"""The lean Llama-family forward the trainer uses on the CPU: the same log-probs and the same gradients as the
model's own forward, with each GRPO prompt computed once for all its samples."""

import pytest
import torch

from verl_runtime.lean_model import lean_path_applies, shared_prefix_logits
from verl_runtime.models import load_causal_lm, load_tokenizer, position_ids_from_mask, response_log_probs
from verl_runtime.rollout.base import assemble_batch, left_pad


def _grpo_batch(tokenizer, samples: int = 3):
    """Three prompts of different lengths, `samples` responses each (some end early at EOS), rows interleaved."""
    prompts = [tokenizer.encode("Q: 2+3=?\nA:"), tokenizer.encode("Hi"), tokenizer.encode("Count: 1 2 3 4")]
    rows = [p for p in prompts for _ in range(samples)]
    prompt_ids, prompt_mask = left_pad(rows, tokenizer.pad_token_id)
    responses = torch.randint(3, 200, (len(rows), 9), generator=torch.Generator().manual_seed(0))
    responses[1, 4] = responses[2, 0] = tokenizer.eos_token_id
    responses[1, 5:] = responses[2, 1:] = tokenizer.pad_token_id
    batch = assemble_batch(prompt_ids, prompt_mask, responses, [tokenizer.eos_token_id])
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(1))  # groups need not be adjacent
    return {key: getattr(batch, key)[order] for key in ("input_ids", "attention_mask", "position_ids", "response_mask")}


def _forward_log_probs(model, batch, response_length):
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits[:, -response_length - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][:, -response_length:, None])[..., 0]


def _gradients(model, log_probs, mask):
    model.zero_grad(set_to_none=True)
    (log_probs * mask).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("model_dir", ["tiny_model_dir", "tiny_llama_dir"])
def test_shared_prompts_give_the_forwards_log_probs_and_gradients(model_dir, request):
    path = request.getfixturevalue(model_dir)
    model, tokenizer = load_causal_lm(path, None, "cpu"), load_tokenizer(path)
    batch = _grpo_batch(tokenizer)
    mask = batch["response_mask"].bool()
    model.train()

    expected = _forward_log_probs(model, batch, 9)
    expected_grads = _gradients(model, expected, mask)
    logits = shared_prefix_logits(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], 9)
    lean = torch.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][:, -9:, None])[..., 0]
    grads = _gradients(model, lean, mask)

    torch.testing.assert_close(lean[mask], expected[mask], atol=1e-5, rtol=0)
    for name, grad in grads.items():
        scale = expected_grads[name].abs().max()
        torch.testing.assert_close(grad / scale, expected_grads[name] / scale, atol=1e-5, rtol=0, msg=name)


def test_the_trainer_takes_the_lean_forward_where_it_applies(tiny_model_dir, tiny_opt_dir):
    """response_log_probs never calls a Llama-family model's forward on the CPU; other models keep theirs."""
    for path, lean in ((tiny_model_dir, True), (tiny_opt_dir, False)):
        model, tokenizer = load_causal_lm(path, None, "cpu"), load_tokenizer(path)
        batch = _grpo_batch(tokenizer)
        calls = []
        handle = model.register_forward_pre_hook(lambda module, args: calls.append(None))
        try:
            with torch.no_grad():
                response_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], 9)
        finally:
            handle.remove()
        assert (len(calls) == 0) == lean


def test_dropout_and_gradient_checkpointing_keep_the_models_forward(tiny_model_dir):
    model, cpu = load_causal_lm(tiny_model_dir, None, "cpu"), torch.device("cpu")
    model.train()
    assert lean_path_applies(model, cpu, 100)
    model.model.layers[0].self_attn.attention_dropout = 0.1
    assert not lean_path_applies(model, cpu, 100)
    model.eval()
    assert lean_path_applies(model, cpu, 100)  # no dropout outside training

    model = load_causal_lm(tiny_model_dir, None, "cpu", gradient_checkpointing=True)
    model.train()
    assert not lean_path_applies(model, cpu, 100)


def test_left_padding_of_one_prompt_does_not_change_its_log_probs(tiny_model_dir):
    """A prompt alone and the same prompt padded in a batch (with another, longer one) give the same log-probs."""
    model, tokenizer = load_causal_lm(tiny_model_dir, None, "cpu"), load_tokenizer(tiny_model_dir)
    batch = _grpo_batch(tokenizer, samples=1)
    alone = {key: value[:1] for key, value in batch.items()}
    first_real = int(alone["attention_mask"][0].argmax())
    alone = {key: value[:, first_real:] for key, value in alone.items()}
    alone["position_ids"] = position_ids_from_mask(alone["attention_mask"])
    with torch.no_grad():
        batched, _ = response_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], 9)
        single, _ = response_log_probs(model, alone["input_ids"], alone["attention_mask"], alone["position_ids"], 9)
    mask = batch["response_mask"][0].bool()
    torch.testing.assert_close(batched[0][mask], single[0][mask], atol=1e-5, rtol=0)

"""An optional learned reward: a local ``AutoModelForSequenceClassification`` directory with one output."""

from pathlib import Path

from verl_runtime.errors import ModelError
from verl_runtime.hub import is_hub_id, snapshot


class RewardModelScorer:
    """Scores texts with a sequence-classification reward model (its single logit is the reward)."""

    def __init__(self, path, device: str = "cpu", dtype=None, micro_batch_size: int = 8):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if is_hub_id(str(path)) and not Path(path).is_dir():
            path = snapshot(str(path))
        path = Path(path)
        if not path.is_dir():
            raise ModelError(f"reward model directory {path} not found: a local directory or a Hub id (org/name)")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype or torch.float32)
        except (OSError, ValueError) as exc:
            raise ModelError(f"cannot load reward model from {path}: {str(exc).splitlines()[0]}") from None
        if self.model.config.num_labels != 1:
            raise ModelError(f"reward model {path} has {self.model.config.num_labels} outputs; it needs exactly 1")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # the classifier reads the last non-pad token, which it finds through config.pad_token_id
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device).eval()
        self.device = device
        self.micro_batch_size = micro_batch_size

    def score(self, texts: list[str]) -> list[float]:
        """Rewards of plain texts, tokenized as the tokenizer does by default (special tokens added)."""
        return self._score_ids([self.tokenizer.encode(t) for t in texts])

    def score_chats(self, prompts: list[list[dict]], responses: list[str]) -> list[float]:
        """Rewards of chat prompts with their responses, in the reward model's own chat template if it has one."""
        chats = [[*p, {"role": "assistant", "content": r}] for p, r in zip(prompts, responses, strict=True)]
        if getattr(self.tokenizer, "chat_template", None):
            texts = [self.tokenizer.apply_chat_template(c, tokenize=False) for c in chats]
            ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]  # the template wrote them
        else:
            ids = [self.tokenizer.encode("\n".join(m["content"] for m in c)) for c in chats]
        return self._score_ids(ids)

    def _score_ids(self, ids: list[list[int]]) -> list[float]:
        import torch

        scores: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(ids), self.micro_batch_size):
                chunk = ids[start : start + self.micro_batch_size]
                batch = self.tokenizer.pad({"input_ids": chunk}, return_tensors="pt")
                logits = self.model(**batch.to(self.device)).logits
                scores.extend(logits[:, 0].float().tolist())
        return scores

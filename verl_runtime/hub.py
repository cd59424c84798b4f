"""Models by Hugging Face Hub id: `org/name` or `org/name@revision`, resolved by huggingface_hub into its cache.

The cache is $HF_HOME (a mounted volume in the images, a PVC on Kubernetes), so a model is downloaded once per
cache. huggingface_hub reads the rest from the environment: HF_TOKEN for gated or private models, HF_ENDPOINT for a
mirror, HF_HUB_OFFLINE=1 to use the cache alone. Every failure is one line that says what to do.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

from verl_runtime.errors import ModelError

# org/name, each part as the Hub allows it; an optional @revision (a branch, tag or commit).
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")
# What a causal LM needs to load: configs, tokenizer files, safetensors weights (no duplicate .bin, ONNX, ...).
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]


def is_hub_id(path: str) -> bool:
    return bool(HUB_ID.match(path)) and not path.startswith((".", "/", "~"))


@lru_cache(maxsize=16)
def snapshot(path: str) -> str:
    """The local folder of a Hub model's snapshot: from the cache, downloaded into it first where needed."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError,
    )

    match = HUB_ID.match(path)
    repo, revision = match["repo"], match["revision"]
    where = f"{repo}" + (f" at revision {revision}" if revision else "")
    try:
        folder = snapshot_download(repo, revision=revision, allow_patterns=MODEL_FILES)
    except GatedRepoError:
        raise ModelError(f"{repo} is a gated model: accept its terms on the Hub, then set HF_TOKEN to a token of "
                         "that account") from None
    except RevisionNotFoundError:
        raise ModelError(f"{repo} has no revision {revision!r}: use a branch, tag or commit of it") from None
    except RepositoryNotFoundError:
        token = "" if os.environ.get("HF_TOKEN") else " (a private one needs HF_TOKEN)"
        raise ModelError(f"{repo} is not a model on {constants.ENDPOINT}{token}: check the id") from None
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise ModelError(f"{where} is not in the Hugging Face cache {constants.HF_HUB_CACHE} and HF_HUB_OFFLINE=1: "
                             "download it there first (`hf download " + repo + "`), or unset HF_HUB_OFFLINE") from None
        raise ModelError(f"cannot reach {constants.ENDPOINT} to download {where}, and it is not in the cache "
                         f"{constants.HF_HUB_CACHE}: set HF_ENDPOINT to a mirror this network reaches, or put the "
                         "model in the cache and set HF_HUB_OFFLINE=1") from None
    except HfHubHTTPError as exc:
        raise ModelError(f"the Hub refused {where}: {str(exc).splitlines()[0]}") from None
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ModelError(f"{where} has no config.json: it is not a transformers model")
    return folder

"""Whether a model named by a Hugging Face hub id can load on this machine: in the local cache, or on a hub that
answers. Asked before the lease and Ray for the settings sentence-transformers and transformers load by name (an
encoder, a tokenizer), so that a typo or a machine without the hub is one line, not minutes of retries and tracebacks
from the stage's actors."""

from __future__ import annotations

import os
import re

HUB_KEYS = ("encode.model", "llm.openai.tokenizer")  # the settings loaded by hub name (the GGUFs have their own resolver)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # owner/name, or a bare name (sentence-transformers' own)
TIMEOUT_S = 5.0


def candidates(key: str, value: str) -> list[str]:
    """The repo ids ``value`` may load as: sentence-transformers prefixes a bare encoder name with its own owner."""
    return [value, f"sentence-transformers/{value}"] if key == "encode.model" and "/" not in value else [value]


def cached(repo: str) -> bool:
    """Whether the local cache holds the repo (any of the files a model or a tokenizer is loaded from)."""
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo, f), str) for f in ("config.json", "modules.json", "tokenizer_config.json", "tokenizer.json"))


def offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def on_hub(repo: str, timeout_s: float = TIMEOUT_S) -> bool | None:
    """True: the hub holds it (gated ones too); False: the hub says there is no such model; None: no answer (no network,
    a timeout, another error)."""
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        model_info(repo, timeout=timeout_s)
        return True
    except GatedRepoError:
        return True
    except RepositoryNotFoundError:
        return False
    except Exception:  # httpx's connect and timeout errors, an HTTP 5xx: the hub did not answer
        return None


def hub_problem(key: str, value: str | None) -> str | None:
    """Why ``key=value`` (a hub id) cannot load here, or None: it is not a hub id (a path that exists, ``bundled:``, a
    URI), it is cached, or the hub holds it."""
    if not value or os.path.exists(os.path.expanduser(value)) or not HUB_ID.match(value):
        return None
    repos = candidates(key, value)
    try:
        if any(cached(r) for r in repos):
            return None
    except ImportError:  # no huggingface_hub: the loader says what it says
        return None
    if offline():
        return (f"{key}={value} is not in the Hugging Face cache here and the hub is off (HF_HUB_OFFLINE): download it "
                f"where the hub answers (huggingface-cli download {repos[-1]}) or give a local path")
    answers = [on_hub(r) for r in repos]
    if True in answers:
        return None
    if False in answers and None not in answers:
        return f"{key}={value}: no such model on the Hugging Face hub (check the name), and none in the cache here"
    return (f"{key}={value} is not in the Hugging Face cache here and the hub (huggingface.co) does not answer: "
            "download it where it does, or give a local path")

"""A scripted backend for fast orchestration tests (never for real runs).

Default replies are deterministic: an answer request gets "i. yes|no" lines chosen by a hash of the prompt
and the line number; a single-pass request gets P(yes) from a hash of the prompt; any other request gets a
numbered list of three yes/no questions. Its context is ``n_ctx`` (default: the embedded engine's, ``llm.llamacpp.n_ctx``)
and a prompt counts characters / 4 + 1 tokens (``prompt_budget``). Pass ``reply`` to
script anything else (a function of the request returning text or a ``Completion``). Every request sent is
appended to ``calls`` (``record=True``, what tests read) or only counted in ``sent`` (``record=False``: what
``make_backend`` builds for a run, whose millions of requests would otherwise stay in the worker's memory).
"""

from __future__ import annotations

import hashlib
import math
import time
from typing import Callable, Sequence

from cqg_ray import progress
from cqg_ray.config import LLMConfig
from cqg_ray.llm.base import Backend, Completion, Request, request_of


def default_reply(req: Request) -> "str | Completion":
    prompt = "\n".join(m["content"] for m in req.messages)
    if req.yes_no:
        p = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") / 2**32
        return Completion("yes" if p > 0.5 else "no", prompt_tokens=len(prompt) // 4 + 1, p_yes=[p])
    if req.n_answers is not None:
        lines = []
        for i in range(1, req.n_answers + 1):
            bit = hashlib.sha256(f"{prompt}\x00{i}".encode()).digest()[0] & 1
            lines.append(f"{i}. {'yes' if bit else 'no'}")
        return "\n".join(lines) + "\n"
    tag = hashlib.sha256(prompt.encode()).hexdigest()[:6]
    return "\n".join(f"{i}. Does the text mention topic {tag}-{i}?" for i in range(1, 4)) + "\n"


class FakeBackend(Backend):
    name = "fake"

    def __init__(self, llm: LLMConfig | None = None, reply: Callable[[Request], "str | Completion"] | None = None, delay_s: float = 0.0, batch_size: int = 8,
                 n_ctx: int | None = None, record: bool = True):
        super().__init__(llm or LLMConfig(backend="fake"))
        self.record = record
        self.n_ctx = n_ctx or self.llm.llamacpp.n_ctx  # the context it stands in for (the prompt-length guard's budget)
        self.reply = reply or default_reply
        self.delay_s = delay_s
        self.batch_size = batch_size
        self.calls: list[Request] = []  # every request sent, when recording
        self.sent = 0  # requests sent

    def prompt_budget(self):
        """Its context ``n_ctx`` and its own token count (characters / 4 + 1, as it reports prompt tokens)."""
        from dataclasses import replace

        return replace(fake_budget(self.llm), context=self.n_ctx)

    def job(self, ds):
        """The one-job stage (``Backend.job``) with this fake's replies, as Ray Data tasks (tests of the vLLM path's pipeline)."""
        from functools import partial

        return ds.map_batches(partial(fake_job_batch, self.llm, self.reply), batch_size=256)

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        """The replies of a batch, all at its end; while ``delay_s`` a request passes, its prompt tokens count as read
        (``progress``), a little at a time, as an engine's would."""
        out = []
        tokens = [sum(len(m["content"]) for m in r.messages) // 4 + 1 for r in requests]
        progress.add(handed=len(requests), planned=sum(tokens))
        for req, n in zip(requests, tokens):
            self.sent += 1
            if self.record:
                self.calls.append(req)
            if self.delay_s:
                slices = max(1, math.ceil(self.delay_s / 0.1))
                for k in range(slices):
                    time.sleep(self.delay_s / slices)
                    progress.add(read=n * (k + 1) // slices - n * k // slices, read_s=self.delay_s / slices)
            else:
                progress.add(read=n)
            r = self.reply(req)
            if isinstance(r, Completion):
                out.append(r)
                continue
            prompt_chars = sum(len(m["content"]) for m in req.messages)
            p_yes = None
            if self.llm.logprobs and req.n_answers is not None:
                p_yes = [1.0 if line.rstrip().endswith("yes") else 0.0 for line in r.splitlines()[: req.n_answers]]
            out.append(Completion(r, prompt_tokens=prompt_chars // 4 + 1, completion_tokens=len(r) // 4 + 1, p_yes=p_yes))
        return out


def fake_job_batch(llm: LLMConfig, reply, batch: dict) -> dict:
    """Completion rows for a batch of one-job rows (what ``FakeBackend.job`` maps)."""
    import json

    rows = [{k: v[i] for k, v in batch.items()} for i in range(len(batch["key"]))]
    done = FakeBackend(llm, reply=reply, record=False).complete([request_of(r) for r in rows])
    out = {k: list(batch[k]) for k in ("key", "request_json", "p_yes_read")}
    out.update({"text": [c.text for c in done], "prompt_tokens": [c.prompt_tokens for c in done],
                "completion_tokens": [c.completion_tokens for c in done], "p_yes_json": [json.dumps(c.p_yes) for c in done],
                "error": [c.error or "" for c in done]})
    return out


def fake_budget(llm: LLMConfig):
    """The fake backend stands in for the embedded engine: its n_ctx, and the fake's own count (characters / 4 + 1)."""
    from cqg_ray.llm.fit import PromptBudget

    def count(req: Request) -> int:
        return sum(len(m["content"]) for m in req.messages) // 4 + 1

    return PromptBudget(llm.llamacpp.n_ctx, count, "fake (characters / 4)", overhead=0)

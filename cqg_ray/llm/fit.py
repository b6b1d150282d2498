"""Prompts that fit the engine: each prompt counted in the engine's tokens against its context, before it is sent.

    budget = stage_budget(cfg.llm)                  # cqg_ray.llm.backends: the engine's context and token counter (None: unknown)
    fitter = PromptFitter(budget, "cqg-generate")
    req = fitter.contrast(positives, negatives, lambda pos, neg: Request(...), what="cluster 17")   # drops or clips texts
    reqs = fitter.text(text, lambda t: answer_requests(t, ...), what="doc 42")                    # clips the text
    fitter.counts      # prompts checked / clipped, texts dropped, characters cut, the longest prompt counted before fitting
                       # (prompts whose byte bound is under the limit are not counted: they fit for sure)

A prompt fits when its tokens (the chat template applied, as the engine builds it) plus the request's ``max_tokens``
are at most the context: ``n_ctx`` for the embedded engine, ``max_model_len`` for vLLM and OpenAI-compatible servers.
A prompt that fits is returned untouched (same ledger key as before); one that cannot be made to fit raises
``PromptTooLong`` naming the stage, the request and the numbers. Counting is exact where the engine's tokenizer is at
hand; a cheap upper bound (template tokens + UTF-8 bytes of the contents: a byte-level BPE token is at least one byte)
skips the exact count for prompts far below the limit. Each engine builds its own budget (its ``prompt_budget``; the
generic ones are here: ``hf_budget``, ``byte_budget``); ``cqg_ray.llm.backends.stage_budget`` picks the one a stage uses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from cqg_ray.llm.base import Request
from cqg_ray.llm.prompts import clip_text

log = logging.getLogger("cqg_ray")

MIN_TEXT_CHARS = 200  # a contrast prompt clips its texts down to this before it drops any
BOUND_SLACK = 8  # tokens a template boundary may add to the byte bound


class PromptTooLong(ValueError):
    """A prompt that cannot be made to fit the engine's context."""


def content_bytes(req: Request) -> int:
    """UTF-8 bytes of a request's messages and reply start: at least its tokens under a byte-level BPE."""
    return sum(len(m["content"].encode("utf-8")) for m in req.messages) + len(req.answer_prefix.encode("utf-8"))


@dataclass
class PromptBudget:
    """The engine's context length and a function counting a request's prompt tokens (chat template applied)."""

    context: int
    count: Callable[[Request], int]
    engine: str  # what counts, for messages: "llama.cpp tokenizer of X", "fake (chars / 4)", ...
    overhead: int = 0  # tokens of the template around empty messages (the byte bound's base)
    exact: bool = True  # False: ``count`` is itself an upper bound (no tokenizer at hand)

    def limit(self, req: Request) -> int:
        return self.context - req.max_tokens

    def bound(self, req: Request) -> int:
        """An upper bound of ``count(req)`` that costs no tokenizing."""
        return self.overhead + BOUND_SLACK + content_bytes(req)

    def tokens(self, req: Request) -> int | None:
        """The prompt's tokens, or None when the byte bound already shows that it fits."""
        if self.bound(req) <= self.limit(req):
            return None
        return self.count(req)


@dataclass
class PromptFitter:
    """Fits one stage's prompts to a budget and counts what it changed (``budget`` None: nothing checked)."""

    budget: PromptBudget | None
    stage: str
    counts: dict[str, int] = field(default_factory=lambda: {"checked": 0, "clipped": 0, "texts_dropped": 0, "chars_cut": 0, "max_tokens_before": 0})

    def _over(self, reqs: Sequence[Request]) -> int:
        """Tokens over the limit of the worst request (0 when all fit); records the longest prompt seen."""
        worst = 0
        for r in reqs:
            n = self.budget.tokens(r)  # type: ignore[union-attr]
            if n is None:
                continue
            self.counts["max_tokens_before"] = max(self.counts["max_tokens_before"], n)
            worst = max(worst, n - self.budget.limit(r))  # type: ignore[union-attr]
        return worst

    def _error(self, what: str, req: Request, detail: str) -> PromptTooLong:
        b = self.budget
        n = b.count(req)  # type: ignore[union-attr]
        return PromptTooLong(
            f"{self.stage}: the prompt of {what} needs {n:,} tokens ({b.engine}) {detail}, but the context holds {b.context:,} "  # type: ignore[union-attr]
            f"tokens and the reply may take {req.max_tokens:,}, leaving {b.limit(req):,} for the prompt. "  # type: ignore[union-attr]
            "Raise the context (llm.llamacpp.n_ctx, llm.vllm.max_model_len, llm.openai.max_model_len) or lower the reply's "
            "max_tokens (llm.max_tokens_generate / llm.max_tokens_answer).")

    def text(self, text: str, build: Callable[[str], list[Request]], what: str) -> list[Request]:
        """The requests ``build(text)`` makes, with ``text`` clipped (the fewest characters cut) until every one fits."""
        reqs = build(text)
        if self.budget is None or not reqs:
            return reqs
        self.counts["checked"] += len(reqs)
        if self._over(reqs) <= 0:
            return reqs
        lo, hi = 0, len(text)  # the longest prefix length that fits: lo fits (checked below), hi does not
        shortest = build("")
        if self._over(shortest) > 0:
            worst = max(shortest, key=lambda r: self.budget.count(r) - self.budget.limit(r))  # type: ignore[union-attr]
            raise self._error(what, worst, "even with its text cut to nothing")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._over(build(clip_text(text, mid) if mid else "")) <= 0:
                lo = mid
            else:
                hi = mid
        clipped = clip_text(text, lo) if lo else ""
        self.counts["clipped"] += len(reqs)
        self.counts["chars_cut"] += len(text) - len(clipped)
        return build(clipped)

    def contrast(self, positives: list[str], negatives: list[str], build: Callable[[list[str], list[str]], Request], what: str,
                 min_chars: int = MIN_TEXT_CHARS) -> tuple[Request, list[str], list[str]]:
        """``build(positives, negatives)`` fitted: texts clipped to a common length (down to ``min_chars``), then
        negatives dropped from the end, then positives, keeping one of each. Returns the request and the texts used."""
        req = build(positives, negatives)
        if self.budget is None:
            return req, positives, negatives
        self.counts["checked"] += 1
        if self._over([req]) <= 0:
            return req, positives, negatives
        before = sum(map(len, positives)) + sum(map(len, negatives))
        longest = max(map(len, [*positives, *negatives]))

        def at(cap: int, pos: list[str], neg: list[str]) -> tuple[Request, list[str], list[str]]:
            p, n = [clip_text(t, cap) for t in pos], [clip_text(t, cap) for t in neg]
            return build(p, n), p, n

        floor = max(1, min(min_chars, longest))
        if self._over([at(floor, positives, negatives)[0]]) <= 0:  # clipping alone is enough: the longest cap that fits
            lo, hi = floor, longest
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._over([at(mid, positives, negatives)[0]]) <= 0:
                    lo = mid
                else:
                    hi = mid
            req, pos, neg = at(lo, positives, negatives)
        else:  # at the floor it still does not fit: drop texts, negatives first, one of each kept
            pos, neg = list(positives), list(negatives)
            while True:
                if len(neg) > 1 and (len(neg) >= len(pos) or len(pos) == 1):
                    neg.pop()
                elif len(pos) > 1:
                    pos.pop()
                else:
                    raise self._error(what, at(floor, pos, neg)[0], f"with {len(pos)} positive and {len(neg)} negative text(s) "
                                      f"clipped to {floor} characters")
                req, p, n = at(floor, pos, neg)
                if self._over([req]) <= 0:
                    pos, neg = p, n
                    break
            self.counts["texts_dropped"] += len(positives) + len(negatives) - len(pos) - len(neg)
        self.counts["clipped"] += 1
        self.counts["chars_cut"] += before - sum(map(len, pos)) - sum(map(len, neg))
        return req, pos, neg

    def report(self) -> dict[str, int]:
        """The counts under the names a stage's manifest uses (``<stage>_prompts_clipped``, ...)."""
        return fit_report(self.counts)

    def log(self) -> None:
        c = self.counts
        if self.budget is None:
            log.warning("%s: prompt lengths not checked (the engine's context length is unknown: set llm.openai.max_model_len)", self.stage)
        elif c["clipped"]:
            log.warning("%s: %d of %d prompts clipped to fit %d tokens of context (%s): %d texts dropped, %d characters cut; "
                        "the longest prompt before clipping had %d tokens", self.stage, c["clipped"], c["checked"], self.budget.context,
                        self.budget.engine, c["texts_dropped"], c["chars_cut"], c["max_tokens_before"])
        else:
            log.info("%s: all %d prompts fit the context (%d tokens, %s)", self.stage, c["checked"], self.budget.context, self.budget.engine)


# ----------------------------------------------------------------------------------------- the engines' budgets


def template_overhead(count: Callable[[Request], int]) -> int:
    return count(Request([{"role": "user", "content": ""}], max_tokens=1))


def byte_budget(context: int, engine: str) -> PromptBudget:
    """No tokenizer at hand: count UTF-8 bytes (an upper bound of a byte-level BPE's tokens) plus a template allowance."""
    def count(req: Request) -> int:
        return 64 + content_bytes(req)

    return PromptBudget(context, count, f"{engine}, counted as UTF-8 bytes (an upper bound: no tokenizer)", overhead=64, exact=False)


def hf_budget(tokenizer_name: str, context: int, engine: str) -> PromptBudget:
    """A Hugging Face tokenizer's chat template (vLLM's own way of building the prompt)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_name)

    def count(req: Request) -> int:
        ids = tok.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # a BatchEncoding in newer transformers
        return len(ids) + (len(tok.encode(req.answer_prefix, add_special_tokens=False)) if req.answer_prefix else 0)

    return PromptBudget(context, count, f"{engine}, tokenizer {tokenizer_name}", overhead=template_overhead(count))


def fit_report(counts: dict) -> dict[str, int | None]:
    """Fitter counts (one fitter's, or several summed) under the names a stage's manifest uses (``<stage>_prompts_clipped``, ...).
    ``longest_prompt_tokens``: the longest prompt that needed counting; None where the byte bound showed every prompt
    to fit without counting its tokens."""
    return {"prompts_checked": counts.get("checked", 0), "prompts_clipped": counts.get("clipped", 0),
            "texts_dropped": counts.get("texts_dropped", 0), "chars_cut": counts.get("chars_cut", 0),
            "longest_prompt_tokens": counts.get("max_tokens_before") or None}


def budget_summary(budget: PromptBudget | None) -> dict[str, Any]:
    """What a stage's manifest records of the budget."""
    if budget is None:
        return {"context": None, "counted_by": "not checked (context unknown)"}
    return {"context": budget.context, "counted_by": budget.engine}

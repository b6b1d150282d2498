"""Requests that ask yes/no questions about one text, in either answer mode (labelling and probing use this).

    answer_requests(text, [3, 7, 9], questions, mode="single", ...)   # three single-pass requests, one per question
    answer_requests(text, [3, 7, 9], questions, mode="packed", ...)   # one A.3 request with three numbered questions

``single``: one prompt per (text, question) (``single_answer_messages``; with ``prompt="judge"`` the faithfulness judge's
after its worked examples, ``judge_shot_messages``), P(yes) read from one position's logits; every prompt about a text
shares its prefix, which the engines compute once. ``packed``: the paper's A.3 prompt,
``per_prompt`` questions at a time, the answers decoded as "i. yes|no" lines. Each request's ``meta`` holds the
caller's fields plus ``question_ids`` (the questions it answers, in answer order).
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

from cqg_ray.config import AnswerPrompt
from cqg_ray.llm.base import Request
from cqg_ray.llm.prompts import SINGLE_ANSWER_PREFIX, answer_messages, chunk_questions, judge_shot_messages, single_answer_messages

AnswerMode = Literal["single", "packed"]


def labelled_yes(req: Request, p_yes: float | None, parsed: bool, yes_above: float) -> bool:
    """A label's yes/no: a single-pass request's P(yes) above ``yes_above`` (``label.yes_above``); a packed one's
    decoded answer."""
    return bool(p_yes > yes_above) if req.yes_no and p_yes is not None else bool(parsed)


def answer_requests(text: str, question_ids: Sequence[int], questions: Sequence[str], mode: AnswerMode, per_prompt: int,
                    max_tokens: int, meta: dict[str, Any] | None = None, prompt: AnswerPrompt = "answer") -> list[Request]:
    """The requests that answer ``questions[q]`` for each q in ``question_ids`` about ``text``."""
    meta = meta or {}
    qids = [int(q) for q in question_ids]
    if prompt not in ("answer", "judge") or (prompt == "judge" and mode != "single"):
        raise ValueError(f"the answer prompt must be 'answer', or 'judge' in single mode; got {prompt!r} in {mode!r} mode")
    if mode == "single":  # the judge's prompt leaves the reply unbegun; the labelling prompt begins it
        messages, prefix = (judge_shot_messages, "") if prompt == "judge" else (single_answer_messages, SINGLE_ANSWER_PREFIX)
        return [Request(messages(text, questions[q]), max_tokens=1, yes_no=True, answer_prefix=prefix, meta={**meta, "question_ids": [q]})
                for q in qids]
    if mode != "packed":
        raise ValueError(f"answer mode must be 'single' or 'packed', got {mode!r}")
    return [Request(answer_messages(text, [questions[q] for q in chunk]), max_tokens=max(max_tokens, 8 * len(chunk)), n_answers=len(chunk),
                    meta={**meta, "question_ids": list(chunk)}) for chunk in chunk_questions(qids, per_prompt)]

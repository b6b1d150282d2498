"""Token model of the prompts: every prompt built with the real prompt functions on empty slots."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cqg_ray.config import PipelineConfig


@dataclass(frozen=True)
class Workload:
    """Token model of the prompts (assumptions; override to match your corpus and model)."""

    prompt_tokens_per_text: float = 128.0  # mean tokens of a corpus text in a prompt (before clipping)
    question_tokens: float = 15.0  # tokens of one generated question
    answer_tokens: float = 4.0  # tokens of one answer line "1. yes\n"
    chat_overhead_tokens: float = 20.0  # chat template around the user message
    chars_per_token: float = 4.0  # English text, BPE tokenizers
    single_question_overhead_tokens: float = 9.0  # single-pass, per question: "1. ", end of turn, assistant header, the reply's "1."
    single_batch: int = 64  # single-pass prompts per prefix tree (the chat template and instruction are computed once per tree)
    parse_rate: float = 1.0  # share of the requested questions that parse as yes/no questions
    filter_survival: float = 1.0  # share of the parsed questions that no filter drops before top-t (cqg.filters; measured: --calibrate)


def _tokens(chars: int, w: Workload) -> float:
    return chars / w.chars_per_token


def clipped_text_tokens(w: Workload, max_chars: int) -> float:
    """Tokens of one corpus text in a prompt: the workload's mean, clipped at the stage's max_text_chars."""
    return min(w.prompt_tokens_per_text, max_chars / w.chars_per_token)


def answer_prompt_tokens(n_questions: float, text_tokens: float, w: Workload) -> float:
    """Tokens of one A.3 prompt with n questions (template measured on the real prompt builder, linear in n)."""
    from cqg_ray.llm.prompts import answer_prompt

    one, two = len(answer_prompt("", [""])), len(answer_prompt("", ["", ""]))
    template_chars = one + (two - one) * (n_questions - 1)
    return w.chat_overhead_tokens + _tokens(template_chars, w) + text_tokens + n_questions * w.question_tokens


def single_pass_tokens(texts: float, pairs: float, text_tokens: float, w: Workload) -> float:
    """Prompt tokens computed by single-pass answering: each labelled text once (with its "Text Chunk" lines), each
    (text, question) pair's own line, and the chat template + instruction once per prefix tree of ``single_batch``
    prompts (a lower bound for servers whose prefix cache keeps every text while its questions are asked)."""
    from cqg_ray.llm.prompts import single_answer_prompt

    head = single_answer_prompt("", "x").split("Text Chunk:")[0]
    around_text = len("Text Chunk:\n\n\nQuestions:\n")
    return (texts * (text_tokens + _tokens(around_text, w)) + pairs * (w.question_tokens + w.single_question_overhead_tokens)
            + math.ceil(pairs / w.single_batch) * (w.chat_overhead_tokens + _tokens(len(head), w)))


def generation_prompt_tokens(cfg: PipelineConfig, w: Workload) -> tuple[float, int]:
    """(tokens of one generation prompt, texts in it) for cqg.method (A.1 or A.2)."""
    from cqg_ray.llm.prompts import cqg_prompt, qaemb_prompt

    c = cfg.cqg
    if c.method == "cqg":
        n_texts = c.n_p + c.n_h + c.n_e
        template = len(cqg_prompt([""] * c.n_p, [""] * (c.n_h + c.n_e), c.questions_per_prompt))
    else:
        n_texts = c.qaemb_articles
        template = len(qaemb_prompt([""] * n_texts, n_questions=c.questions_per_prompt))
    return w.chat_overhead_tokens + _tokens(template, w) + n_texts * clipped_text_tokens(w, c.max_text_chars), n_texts


def engine_context(cfg: PipelineConfig) -> tuple[int | None, str]:
    """(context length in tokens, where it comes from) of the configured engine; None for a server that says it at run time."""
    llm = cfg.llm
    if llm.backend in ("llamacpp", "fake"):
        return llm.llamacpp.n_ctx, "llm.llamacpp.n_ctx"
    if llm.backend == "vllm":
        return llm.vllm.max_model_len, "llm.vllm.max_model_len"
    return llm.openai.max_model_len, "llm.openai.max_model_len" if llm.openai.max_model_len else "the server's (asked at run time)"


def context_check(cfg: PipelineConfig, w: Workload) -> list[dict]:
    """Per LLM stage: the prompt's tokens at the workload's mean text and at texts of max_text_chars, against the context
    minus the reply; whether the guard (``cqg_ray.llm.fit``) will clip, and to how many characters a text is cut."""
    from cqg_ray.llm.prompts import cqg_prompt, qaemb_prompt, single_answer_prompt

    context, source = engine_context(cfg)
    c, lab = cfg.cqg, cfg.label
    rows = []
    n_texts = c.n_p + c.n_h + c.n_e if c.method == "cqg" else c.qaemb_articles
    template = len(cqg_prompt([""] * c.n_p, [""] * (c.n_h + c.n_e), c.questions_per_prompt) if c.method == "cqg"
                   else qaemb_prompt([""] * n_texts, n_questions=c.questions_per_prompt))
    gen_base = w.chat_overhead_tokens + _tokens(template, w)
    single = cfg.llm.answer_mode == "single"
    answer_q = 1 if single else lab.questions_per_prompt
    answer_base = (w.chat_overhead_tokens + _tokens(len(single_answer_prompt("", "x")), w) + w.question_tokens if single
                   else answer_prompt_tokens(answer_q, 0.0, w))
    answer_reply = 1 if single else max(cfg.llm.max_tokens_answer, 8 * answer_q)
    for stage, base, texts, max_chars, reply in (
        ("cqg-generate", gen_base, n_texts, c.max_text_chars, cfg.llm.max_tokens_generate),
        ("cqg-probe", answer_base, 1, c.max_text_chars, answer_reply),
        ("labels", answer_base, 1, lab.max_text_chars, answer_reply),
    ):
        mean = base + texts * clipped_text_tokens(w, max_chars)
        longest = base + texts * max_chars / w.chars_per_token
        row = {"stage": stage, "context": context, "reply_tokens": reply, "prompt_tokens_mean": int(round(mean)),
               "prompt_tokens_longest": int(round(longest)), "source": source}
        if context is None:
            row["verdict"] = "checked at run time against the server's context"
        else:
            limit = context - reply
            fit_chars = int(max(0.0, (limit - base) / texts * w.chars_per_token))
            row["text_chars_that_fit"] = fit_chars
            if base >= limit:
                row["verdict"] = "does not fit even without texts: the stage stops with an error"
            elif longest <= limit:
                row["verdict"] = "fits"
            else:
                share = "every prompt" if mean > limit else "prompts with long texts"
                cut = f"texts cut to ~{fit_chars:,} characters" + (" and some dropped" if stage == "cqg-generate" and fit_chars < 200 else "")
                row["verdict"] = f"{share} clipped: {cut}"
        rows.append(row)
    return rows

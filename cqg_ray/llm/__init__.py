"""The one LLM layer: prompts (paper Appendix A), parsers, backends (llamacpp, openai, vllm, fake), ledger.

    from cqg_ray.llm import Request, run_requests, answer_messages
    results = run_requests([Request(answer_messages(text, qs), 200, n_answers=len(qs))], cfg.llm, run, "labels")
"""

from cqg_ray.llm.backends import make_backend
from cqg_ray.llm.base import Backend, BackendError, Completion, Request, answer_gbnf, answer_regex, backend_identity
from cqg_ray.llm.parse import ParseError, QuestionList, parse_answers, parse_questions
from cqg_ray.llm.prompts import QAEMB_EXAMPLE_QUESTIONS, answer_messages, chunk_questions, clip_text, cqg_messages, qaemb_messages
from cqg_ray.llm.runner import LLMResult, answers_table, run_requests, stage_stats

__all__ = [
    "Backend",
    "BackendError",
    "Completion",
    "Request",
    "answer_gbnf",
    "answer_regex",
    "backend_identity",
    "make_backend",
    "ParseError",
    "QuestionList",
    "parse_answers",
    "parse_questions",
    "QAEMB_EXAMPLE_QUESTIONS",
    "answer_messages",
    "chunk_questions",
    "clip_text",
    "cqg_messages",
    "qaemb_messages",
    "LLMResult",
    "answers_table",
    "run_requests",
    "stage_stats",
]

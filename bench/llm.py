"""LLM layer benchmark: embedded llama.cpp throughput, and prompt tokens per labelled (text, question) pair
with the paper's 20 questions per prompt (A.3) versus one question per prompt (the QAEmb way).

    python bench/llm.py                               # bundled Qwen2.5-Coder-0.5B, 3 texts x 20 questions
    python bench/llm.py --model bundled:smollm2-135m --texts 2 --json out.json

Both ways label the same texts x questions with the same backend (constrained yes/no lines, temperature 0).
Prompt tokens are the backend's own counts of the full chat-templated prompt (what an API bills), so the
ratio does not depend on llama.cpp's prefix cache; wall times do benefit from it in both ways (the prompts
are sent grouped by text, as the runner sends them). The last line is the headline ratio alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cqg_ray.config import LLMConfig, LlamaCppConfig  # noqa: E402
from cqg_ray.llm.base import Request  # noqa: E402
from cqg_ray.llm.engines.llamacpp import LlamaCppBackend  # noqa: E402
from cqg_ray.llm.parse import ParseError, parse_answers  # noqa: E402
from cqg_ray.llm.prompts import QAEMB_EXAMPLE_QUESTIONS, answer_messages, clip_text  # noqa: E402

QUESTIONS = list(QAEMB_EXAMPLE_QUESTIONS) + [
    "Does the text express an opinion?",
    "Is the text about a film or a book?",
    "Does the text mention a person by name?",
    "Is the text about science or nature?",
    "Does the text describe a product?",
    "Is the text written in the first person?",
    "Does the text mention money or prices?",
    "Is the text about history?",
    "Does the text contain a question?",
    "Is the text about sports?",
    "Does the text mention an animal?",
]


def load_texts(n: int, max_chars: int) -> list[str]:
    texts = []
    with open(ROOT / "tests" / "fixtures" / "corpus_400.jsonl") as f:
        for line in f:
            t = json.loads(line)["text"]
            if len(t) >= 120:  # paragraphs, not one-liners
                texts.append(clip_text(t, max_chars))
            if len(texts) == n:
                break
    return texts


def run_way(backend: LlamaCppBackend, requests: list[Request]) -> dict:
    t0 = time.perf_counter()
    outs = backend.complete(requests)
    wall = time.perf_counter() - t0
    parsed = 0
    for r, o in zip(requests, outs):
        try:
            parse_answers(o.text, r.n_answers)
            parsed += 1
        except ParseError:
            pass
    pt = sum(o.prompt_tokens for o in outs)
    ct = sum(o.completion_tokens for o in outs)
    pairs = sum(r.n_answers for r in requests)
    return {
        "requests": len(requests),
        "pairs": pairs,
        "wall_s": round(wall, 2),
        "requests_per_s": round(len(requests) / wall, 3),
        "prompt_tokens": pt,
        "completion_tokens": ct,
        "prompt_tokens_per_s": round(pt / wall, 1),
        "completion_tokens_per_s": round(ct / wall, 1),
        "pairs_per_s": round(pairs / wall, 2),
        "parsed": parsed,
        "prompt_tokens_per_pair": round(pt / pairs, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bundled:qwen2.5-coder-0.5b")
    ap.add_argument("--texts", type=int, default=3)
    ap.add_argument("--questions", type=int, default=20, help="questions per text (the paper groups 20 per prompt)")
    ap.add_argument("--max-chars", type=int, default=600)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    if not 1 <= args.questions <= len(QUESTIONS):
        ap.error(f"--questions must be in 1..{len(QUESTIONS)}")

    llm = LLMConfig(backend="llamacpp", llamacpp=LlamaCppConfig(model=args.model, n_threads=args.threads))
    texts = load_texts(args.texts, args.max_chars)
    qs = QUESTIONS[: args.questions]
    grouped = [Request(answer_messages(t, qs), max_tokens=8 * len(qs) + 8, n_answers=len(qs)) for t in texts]
    single = [Request(answer_messages(t, [q]), max_tokens=16, n_answers=1) for t in texts for q in qs]

    t0 = time.perf_counter()
    backend = LlamaCppBackend(llm)
    load_s = time.perf_counter() - t0
    backend.complete([Request(answer_messages("warm up", ["Is it?"]), 8, 1)])
    try:
        g = run_way(backend, grouped)
        s = run_way(backend, single)
    finally:
        backend.close()
    ratio = s["prompt_tokens_per_pair"] / g["prompt_tokens_per_pair"]
    report = {
        "model": args.model,
        "threads": backend.n_threads,
        "texts": len(texts),
        "questions_per_text": len(qs),
        "load_s": round(load_s, 2),
        "grouped_20_per_prompt" if len(qs) == 20 else f"grouped_{len(qs)}_per_prompt": g,
        "one_per_prompt": s,
        "prompt_tokens_per_pair_ratio": round(ratio, 2),
    }
    print(f"model {args.model}, {backend.n_threads} threads, load {load_s:.1f}s, {len(texts)} texts x {len(qs)} questions")
    for name, r in (("grouped", g), ("one-per-prompt", s)):
        print(
            f"{name:>15}: {r['requests']:3d} requests in {r['wall_s']:6.1f}s = {r['requests_per_s']:.2f} req/s, "
            f"{r['pairs_per_s']:.2f} pairs/s, {r['prompt_tokens_per_s']:.0f} prompt tok/s, "
            f"{r['completion_tokens_per_s']:.1f} completion tok/s, {r['prompt_tokens_per_pair']:.1f} prompt tok/pair, "
            f"{r['parsed']}/{r['requests']} parsed"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"prompt_tokens_per_pair_ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()

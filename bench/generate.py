"""Question generation: cluster prompts decoded together (continuous batching) against one at a time.

    python bench/generate.py                      # 32 CQG prompts on clusters of the shared corpus, bundled 0.5B model
    python bench/generate.py --prompts 8 --batch 8

Both sides run the same A.1 prompts (6 positives, 12 negatives, texts clipped at 200 characters, as the demo) on
the same llama.cpp model with greedy decoding and at most 260 new tokens: one at a time through
``create_chat_completion`` (the path before batching), and ``--batch`` sequences at a time through
``BatchEngine.generate``. Printed: wall time, prompt and generated tokens, how many replies are identical and how
many questions each side parsed. Last line: generation_batch_speedup.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import cpu_line, cqg_prompts  # noqa: E402

from cqg_ray.config import LLMConfig, LlamaCppConfig  # noqa: E402
from cqg_ray.llm.base import Request  # noqa: E402
from cqg_ray.llm.llamacpp import LlamaCppBackend  # noqa: E402
from cqg_ray.llm.parse import parse_questions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16, help="sequences decoded together (llamacpp.batch_generate)")
    ap.add_argument("--max-tokens", type=int, default=260)
    ap.add_argument("--model", default="bundled:qwen2.5-coder-0.5b")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(cpu_line())
    reqs = [Request(m, max_tokens=args.max_tokens) for m in cqg_prompts(args.prompts, args.seed)]
    b = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(model=args.model, batch_generate=args.batch)))

    t0 = time.perf_counter()
    batched = dict(b.generate_batched(reqs))
    t_batch = time.perf_counter() - t0
    t0 = time.perf_counter()
    one = [b.complete_one(r) for r in reqs]
    t_one = time.perf_counter() - t0

    for name, outs, wall in (("one at a time", one, t_one), (f"batched x{args.batch}", [batched[i] for i in range(len(reqs))], t_batch)):
        pt, ct = sum(o.prompt_tokens for o in outs), sum(o.completion_tokens for o in outs)
        nq = sum(len(parse_questions(o.text)) for o in outs)
        print(f"{name:>14}: {wall:7.1f} s  {len(outs)} prompts  {pt} prompt + {ct} generated tokens  {ct / wall:6.1f} generated tok/s  {nq} questions parsed")
    same = sum(one[i].text == batched[i].text for i in range(len(reqs)))
    print(f"identical replies: {same} of {len(reqs)} (batched matrix shapes round differently; greedy choices may then part)")
    print(f"generation_batch_speedup: {t_one / t_batch:.2f}")


if __name__ == "__main__":
    main()

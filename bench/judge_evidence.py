"""The judge asked for the evidence first (a generated span, then its answer) against the default judge, on the same pairs.

    python bench/judge_evidence.py                 # 12 yes and 12 no pairs of the choosing parts, the bundled 1.5B
    python bench/judge_evidence.py --per-side 40

The pairs are drawn (seeded) from the property sets' choosing parts only (``bench/judge_check.py``: never the held-out
parts). Each pair is asked twice: the default judge (``judge_shot_messages``, single-pass P(yes) > 0.5) and a prompt
that asks the judge to copy the words of the text that show the answer, or "none", then to answer on a second line
(greedy generation, ``EVIDENCE``; the answer is the word after the last "Answer:"). Printed: every evidence reply,
agreement with the hand answers apart for yes and for no per prompt, seconds; last line
``judge_evidence_vs_default_balanced``: the evidence prompt's balanced accuracy over the default judge's.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import cpu_line  # noqa: E402
from judge_check import DATA, PROPERTY, ask, balanced, read_pairs, summary  # noqa: E402

from cqg_ray.config import LLMConfig, LlamaCppConfig  # noqa: E402
from cqg_ray.llm.base import Request  # noqa: E402
from cqg_ray.llm.engines.llamacpp import LlamaCppBackend  # noqa: E402

EVIDENCE = ("Read the text and the question. First copy the exact words of the text that show the answer is yes, or write "
            "none if no words of the text show it. Then answer yes or no: yes only if the copied words show it.\n\n"
            "Text: {t}\n\nQuestion: {q}\n\nReply in two lines:\nEvidence: <the text's words, or none>\nAnswer: <yes or no>")


def evidence_answer(reply: str) -> bool:
    """The reply's answer: yes when the word after its last "Answer:" (or the reply itself) starts with yes."""
    return reply.lower().split("answer:")[-1].strip().startswith("yes")


def rates(rows: list[dict], p: list[float]) -> tuple[float, float]:
    """(agreement where the hand answer is yes, where it is no) at P(yes) > 0.5 (`judge_check.summary`)."""
    s = summary(rows, p)
    return s["yes_rate_where_yes"], 1 - s["yes_rate_where_no"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge", default="bundled:qwen2.5-coder-1.5b")
    ap.add_argument("--per-side", type=int, default=12, help="pairs whose hand answer is yes, and as many whose answer is no")
    ap.add_argument("--engine", default="torch-float32", help="the embedded engine for both prompts")
    a = ap.parse_args()
    print(cpu_line())
    rows = [r for p in PROPERTY for r in read_pairs(str(DATA / f"{p}.jsonl"))]
    random.Random(0).shuffle(rows)
    rows = [r for r in rows if r["answer"]][: a.per_side] + [r for r in rows if not r["answer"]][: a.per_side]
    llm = LLMConfig(llamacpp=LlamaCppConfig(model=a.judge, generate_engine=a.engine, score_engine=a.engine, batch_generate=16))
    backend = LlamaCppBackend(llm)
    t0 = time.time()
    outs = backend.complete([Request([{"role": "user", "content": EVIDENCE.format(t=r["text"], q=r["question"])}], max_tokens=48) for r in rows])
    evidence_s = time.time() - t0
    said = [1.0 if evidence_answer(c.text) else 0.0 for c in outs]
    for r, c, s in zip(rows, outs, said):
        print(json.dumps({"hand": r["answer"], "said": s > 0.5, "question": r["question"], "text": r["text"][:90], "reply": c.text.replace("\n", " | ")[:160]}))
    by_default, default_s = ask(backend, rows, "judge_shots")  # the default judge, as bench/judge_check.py asks it
    ev, de = rates(rows, said), rates(rows, by_default)
    print(f"evidence first: yes {ev[0]:.3f} / no {ev[1]:.3f}, {evidence_s:.0f} s for {len(rows)} pairs")
    print(f"default judge (worked examples, single-pass): yes {de[0]:.3f} / no {de[1]:.3f}, {default_s:.0f} s")
    print(f"judge_evidence_vs_default_balanced: {balanced(rows, said, 0.5) / balanced(rows, by_default, 0.5):.3f}")


if __name__ == "__main__":
    main()

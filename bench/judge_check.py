"""How far the faithfulness judge can be trusted: its answers against a person's, beside the labelling prompt.

    python bench/judge_check.py                       # the default judge (bundled 1.5B) on the three sets of bench/data
    python bench/judge_check.py --judge bundled:qwen2.5-coder-0.5b --pairs my_pairs.jsonl

Sets (JSONL of {text, question, answer}, the answers a person wrote):
- ``judge_pairs.jsonl``: 50 hand-written pairs, 25 yes and 25 no: general property questions that hold, ones that
  do not, and two of the kind the shipped model writes ("Is the offer subject to Goldman signing ...?");
- ``judge_pairs_shipped.jsonl``: 50 (STS-B text, question) pairs drawn at random from the judgements of
  ``cqg-ray evaluate cqg-minilm-ref --tasks faithfulness`` (24 questions the model marked active, 26 inactive),
  answered by hand: all 50 are "no". The judge's wording was chosen on this set;
- ``judge_pairs_shipped_holdout.jsonl``: the next 50 of the same draw (24 active), answered by hand after the wording
  was chosen, never used to choose anything: all 50 are "no";
- ``judge_pairs_property.jsonl`` / ``judge_pairs_property_holdout.jsonl``: pairs drawn at random from a
  property-question model's active and answered-no samples (``bench/draw_judge_pairs.py`` on the demo model kept in
  ``bench/data/demo_model_20261127``, STS-B test sentences), answered by hand without the judge's answers; the
  held-out part is never used to choose the judge's prompt or model. On these the model's yes-precision is printed by
  hand and by the judge, and on the held-out part the judge's agreement apart for yes and for no.
Side by side on the same pairs and the same model: the judge's prompt (``judge_messages``, what
``cqg-ray evaluate --tasks faithfulness`` asks) and the single-pass labelling prompt (``single_answer_messages``).
Printed per set: agreement with the written answers, the yes-rate where the answer is yes and where it is no, every
disagreement, pairs/s; peak RSS. Then ``judge_hand_pairs_property``, ``judge_agreement_yes`` and ``judge_agreement_no``
(the held-out property pairs); last line: judge_agreement (the judge prompt, all sets pooled).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import cpu_line  # noqa: E402

from cqg_ray.config import LLMConfig, LlamaCppConfig  # noqa: E402
from cqg_ray.llm.base import Request  # noqa: E402
from cqg_ray.llm.engines.llamacpp import LlamaCppBackend  # noqa: E402
from cqg_ray.llm.prompts import SINGLE_ANSWER_PREFIX, judge_messages, single_answer_messages  # noqa: E402

SETS = [str(ROOT / "bench" / "data" / f) for f in ("judge_pairs.jsonl", "judge_pairs_shipped.jsonl", "judge_pairs_shipped_holdout.jsonl",
                                                    "judge_pairs_property.jsonl", "judge_pairs_property_holdout.jsonl")]
PROPERTY, HELD_OUT = "judge_pairs_property", "judge_pairs_property_holdout.jsonl"


def read_pairs(path: str) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        if not (isinstance(r.get("text"), str) and isinstance(r.get("question"), str) and isinstance(r.get("answer"), bool)):
            raise SystemExit(f"{path}: every line needs text, question (strings) and answer (true/false); got {r}")
    return rows


def ask(backend: LlamaCppBackend, rows: list[dict], prompt: str) -> tuple[list[float], float]:
    if prompt == "judge":
        reqs = [Request(judge_messages(r["text"], r["question"]), max_tokens=1, yes_no=True) for r in rows]
    else:
        reqs = [Request(single_answer_messages(r["text"], r["question"]), max_tokens=1, yes_no=True,
                        answer_prefix=SINGLE_ANSWER_PREFIX) for r in rows]
    t0 = time.time()
    outs = backend.complete(reqs)
    secs = time.time() - t0
    bad = [c.error for c in outs if c.error or not c.p_yes]
    if bad:
        raise SystemExit(f"the judge failed on {len(bad)} pairs: {bad[:3]}")
    return [c.p_yes[0] for c in outs], secs


def summary(rows: list[dict], p: list[float]) -> dict:
    said = [x > 0.5 for x in p]
    yes = [s for s, r in zip(said, rows) if r["answer"]]
    no = [s for s, r in zip(said, rows) if not r["answer"]]
    return {
        "agreement": round(sum(s == r["answer"] for s, r in zip(said, rows)) / len(rows), 4),
        "yes_rate_where_yes": round(sum(yes) / len(yes), 4) if yes else None,  # None: no pair of that answer in the set
        "yes_rate_where_no": round(sum(no) / len(no), 4) if no else None,
        "wrong": [{"text": r["text"], "question": r["question"], "answer": r["answer"], "p_yes": round(x, 3)}
                  for r, x, s in zip(rows, p, said) if s != r["answer"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge", default="bundled:qwen2.5-coder-1.5b", help="llama.cpp model (bundled name, GGUF path or hub file)")
    ap.add_argument("--pairs", nargs="+", default=SETS, help="JSONL files of {text, question, answer}")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    print(cpu_line())
    backend = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(model=a.judge)))
    print(f"judge: {a.judge}")
    res: dict = {"sets": {}}
    pooled = {"judge": [], "labelling": []}
    for path in a.pairs:
        if not Path(path).exists():
            print(f"\n{Path(path).name}: not there (skipped)")
            continue
        rows = read_pairs(path)
        name = Path(path).name
        print(f"\n{name}: {len(rows)} hand-answered pairs ({sum(r['answer'] for r in rows)} yes)")
        res["sets"][name] = {}
        for prompt in ("judge", "labelling"):
            ask(backend, rows[:2], prompt)  # load the model and engine before timing
            p, secs = ask(backend, rows, prompt)
            s = {**summary(rows, p), "pairs_per_s": round(len(rows) / secs, 2)}
            res["sets"][name][prompt] = s
            pooled[prompt] += [(x > 0.5) == r["answer"] for x, r in zip(p, rows)]
            print(f"{prompt} prompt: agreement {s['agreement']}, yes-rate where the answer is yes {s['yes_rate_where_yes']}, "
                  f"where it is no {s['yes_rate_where_no']}, {s['pairs_per_s']} pairs/s")
            for w in s["wrong"]:
                print(f"   wrong: {w['text'][:80]!r} / {w['question'][:100]!r}: written {'yes' if w['answer'] else 'no'}, P(yes) {w['p_yes']}")
        if all("active" in r for r in rows):  # drawn from a model's output: its yes-precision by hand and by the judge
            active = [i for i, r in enumerate(rows) if r["active"]]
            by_hand = sum(rows[i]["answer"] for i in active) / len(active)
            judge_p, _ = ask(backend, [rows[i] for i in active], "judge")
            by_judge = sum(x > 0.5 for x in judge_p) / len(active)
            res["sets"][name]["yes_precision"] = {"by_hand": round(by_hand, 4), "by_judge": round(by_judge, 4), "active_pairs": len(active)}
            print(f"the model's yes-precision on its {len(active)} active pairs: by hand {by_hand:.3f}, by the judge {by_judge:.3f}")
    res["pooled"] = {k: round(sum(v) / len(v), 4) for k, v in pooled.items()}
    props = [n for n in res["sets"] if n.startswith(PROPERTY)]
    if HELD_OUT in res["sets"]:  # the judge on the held-out property pairs, apart for yes and for no
        held = res["sets"][HELD_OUT]["judge"]
        res["agreement_yes"], res["agreement_no"] = held["yes_rate_where_yes"], round(1 - held["yes_rate_where_no"], 4)
        res["hand_pairs_property"] = sum(len(read_pairs(p)) for p in a.pairs if Path(p).name in props)
    res["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(f"\npooled agreement: judge prompt {res['pooled']['judge']}, labelling prompt {res['pooled']['labelling']} "
          f"({len(pooled['judge'])} pairs); peak RSS {res['peak_rss_mb']} MB")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    if HELD_OUT in res["sets"]:
        print(f"judge_hand_pairs_property: {res['hand_pairs_property']}")
        print(f"judge_agreement_yes: {res['agreement_yes']}")
        print(f"judge_agreement_no: {res['agreement_no']}")
    print(f"judge_agreement: {res['pooled']['judge']}")


if __name__ == "__main__":
    main()

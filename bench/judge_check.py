"""How far the faithfulness judge can be trusted: its answers against a person's, per prompt, beside the labelling prompt.

    python bench/judge_check.py                       # the default judge (bundled 1.5B) on every set of bench/data
    python bench/judge_check.py --judge bundled:qwen2.5-coder-0.5b --pairs my_pairs.jsonl

Sets (JSONL of {text, question, answer}, the answers a person wrote):
- ``judge_pairs.jsonl``: 50 hand-written pairs, 25 yes and 25 no: general property questions that hold, ones that
  do not, and two of the kind the shipped model writes ("Is the offer subject to Goldman signing ...?");
- ``judge_pairs_shipped.jsonl``: 50 (STS-B text, question) pairs drawn at random from the judgements of
  ``cqg-ray evaluate cqg-minilm-ref --tasks faithfulness`` (24 questions the model marked active, 26 inactive),
  answered by hand: all 50 are "no". The judge's wording was chosen on this set;
- ``judge_pairs_shipped_holdout.jsonl``: the next 50 of the same draw (24 active), answered by hand after the wording
  was chosen, never used to choose anything: all 50 are "no";
- the property sets, pairs drawn at random from a property-question model's active and answered-no samples
  (``bench/draw_judge_pairs.py`` on the demo model kept in ``bench/data/demo_model_20261127``), answered by hand
  without the judge's answers, each in a part that may choose the judge's prompt and threshold and a held-out part
  (``*_holdout.jsonl``) that never chooses anything: ``judge_pairs_property*`` (STS-B test sentences, 120 + 80),
  ``judge_pairs_sts1213*`` (STS12 and STS13 sentences, 160 + 160), ``judge_pairs_scifact*`` (SciFact claims, 100 + 100).
Every pair is asked once per prompt (``PROMPTS``: the judge's, the labelling prompt, and the judge's with worked
examples; "mean": several answers, their P(yes) averaged); P(yes) > 0.5 is the answer, and per prompt a threshold
chosen on the choosing parts only (the best balanced accuracy) is tried on the held-out parts. Printed per set and
prompt: agreement, the yes-rate where the answer is yes and where it is no, every disagreement (the default prompt),
pairs/s; the model's yes-precision by hand and by the judge; peak RSS. Then ``judge_hand_pairs_property`` (the
property pairs), ``judge_agreement_yes`` and ``judge_agreement_no`` (the default judge on the pooled held-out property
parts); last line: judge_agreement (the default judge, every set pooled).
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
from cqg_ray.llm.prompts import SINGLE_ANSWER_PREFIX, judge_messages, judge_shot_messages, single_answer_messages  # noqa: E402

DATA = ROOT / "bench" / "data"
PROPERTY = ("judge_pairs_property", "judge_pairs_sts1213", "judge_pairs_scifact")  # drawn from a property-question model
SETS = [str(DATA / f) for f in ("judge_pairs.jsonl", "judge_pairs_shipped.jsonl", "judge_pairs_shipped_holdout.jsonl",
                                *(f"{p}{part}.jsonl" for p in PROPERTY for part in ("", "_holdout")))]
PROMPTS = ("judge", "labelling", "judge_shots")
DEFAULT = "judge_shots"  # the prompt `cqg-ray evaluate --tasks faithfulness` asks (the plain "judge" until 2026-11-27)


def held_out(name: str) -> bool:
    return name.endswith("_holdout.jsonl")


def read_pairs(path: str) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    for r in rows:
        if not (isinstance(r.get("text"), str) and isinstance(r.get("question"), str) and isinstance(r.get("answer"), bool)):
            raise SystemExit(f"{path}: every line needs text, question (strings) and answer (true/false); got {r}")
    return rows


def requests(rows: list[dict], prompt: str) -> list[Request]:
    if prompt == "judge":
        return [Request(judge_messages(r["text"], r["question"]), max_tokens=1, yes_no=True) for r in rows]
    if prompt == "judge_shots":
        return [Request(judge_shot_messages(r["text"], r["question"]), max_tokens=1, yes_no=True) for r in rows]
    return [Request(single_answer_messages(r["text"], r["question"]), max_tokens=1, yes_no=True, answer_prefix=SINGLE_ANSWER_PREFIX)
            for r in rows]


def ask(backend, rows: list[dict], prompt: str) -> tuple[list[float], float]:
    reqs = requests(rows, prompt)
    t0 = time.time()
    outs = backend.complete(reqs)
    secs = time.time() - t0
    bad = [c.error for c in outs if c.error or not c.p_yes]
    if bad:
        raise SystemExit(f"the judge failed on {len(bad)} pairs: {bad[:3]}")
    return [c.p_yes[0] for c in outs], secs


def summary(rows: list[dict], p: list[float], threshold: float = 0.5) -> dict:
    said = [x > threshold for x in p]
    yes = [s for s, r in zip(said, rows) if r["answer"]]
    no = [s for s, r in zip(said, rows) if not r["answer"]]
    return {
        "agreement": round(sum(s == r["answer"] for s, r in zip(said, rows)) / len(rows), 4) if rows else None,
        "yes_rate_where_yes": round(sum(yes) / len(yes), 4) if yes else None,  # None: no pair of that answer in the set
        "yes_rate_where_no": round(sum(no) / len(no), 4) if no else None,
        "wrong": [{"text": r["text"], "question": r["question"], "answer": r["answer"], "p_yes": round(x, 3)}
                  for r, x, s in zip(rows, p, said) if s != r["answer"]],
    }


def balanced(rows: list[dict], p: list[float], threshold: float) -> float:
    s = summary(rows, p, threshold)
    return ((s["yes_rate_where_yes"] or 0.0) + 1 - (s["yes_rate_where_no"] or 0.0)) / 2


def best_threshold(rows: list[dict], p: list[float]) -> float:
    """The threshold on P(yes) with the best balanced accuracy on these pairs (ties: the one nearest 0.5)."""
    cands = sorted({0.5, *(round(x, 4) for x in p)})
    return max(cands, key=lambda t: (round(balanced(rows, p, t), 6), -abs(t - 0.5)))


def check(backend, paths: list[str], prompts: tuple[str, ...] = PROMPTS, log=print) -> dict:
    """Every set asked under every prompt; the figures of the module docstring (``res``)."""
    res: dict = {"sets": {}}
    got: dict[str, list] = {}  # set name -> (rows, {prompt: P(yes)})
    for path in paths:
        if not Path(path).exists():
            log(f"\n{Path(path).name}: not there (skipped)")
            continue
        rows, name = read_pairs(path), Path(path).name
        log(f"\n{name}: {len(rows)} hand-answered pairs ({sum(r['answer'] for r in rows)} yes)")
        res["sets"][name], got[name] = {}, (rows, {})
        for prompt in prompts:
            ask(backend, rows[:2], prompt)  # load the model and engine before timing
            p, secs = ask(backend, rows, prompt)
            got[name][1][prompt] = p
            s = {**summary(rows, p), "pairs_per_s": round(len(rows) / secs, 2)}
            res["sets"][name][prompt] = {k: v for k, v in s.items() if prompt == DEFAULT or k != "wrong"}
            log(f"{prompt} prompt: agreement {s['agreement']}, yes-rate where the answer is yes {s['yes_rate_where_yes']}, "
                f"where it is no {s['yes_rate_where_no']}, {s['pairs_per_s']} pairs/s")
            if prompt == DEFAULT:
                for w in s["wrong"]:
                    log(f"   wrong: {w['text'][:80]!r} / {w['question'][:100]!r}: written {'yes' if w['answer'] else 'no'}, P(yes) {w['p_yes']}")
        if len(prompts) > 1:  # several answers: the mean of the prompts' P(yes)
            got[name][1]["mean"] = [sum(xs) / len(xs) for xs in zip(*(got[name][1][q] for q in prompts))]
            s = summary(rows, got[name][1]["mean"])
            res["sets"][name]["mean"] = {k: v for k, v in s.items() if k != "wrong"}
            log(f"mean of the {len(prompts)} prompts: agreement {s['agreement']}, yes-rate where yes {s['yes_rate_where_yes']}, "
                f"where no {s['yes_rate_where_no']}")
        if all("active" in r for r in rows):  # drawn from a model's output: its yes-precision by hand and by the judge
            active = [i for i, r in enumerate(rows) if r["active"]]
            by_hand = sum(rows[i]["answer"] for i in active) / len(active)
            by_judge = sum(got[name][1][DEFAULT][i] > 0.5 for i in active) / len(active)
            res["sets"][name]["yes_precision"] = {"by_hand": round(by_hand, 4), "by_judge": round(by_judge, 4), "active_pairs": len(active)}
            log(f"the model's yes-precision on its {len(active)} active pairs: by hand {by_hand:.3f}, by the judge {by_judge:.3f}")
    pool = lambda names, prompt: ([r for n in names for r in got[n][0]], [x for n in names for x in got[n][1][prompt]])  # noqa: E731
    variants = (*prompts, "mean") if len(prompts) > 1 else prompts
    res["pooled"] = {}
    for prompt in variants:
        rows, p = pool(list(got), prompt)
        res["pooled"][prompt] = summary(rows, p)["agreement"] if rows else None
    props = [n for n in got if n.startswith(PROPERTY)]
    choose, held = [n for n in props if not held_out(n)], [n for n in props if held_out(n)]
    if held:  # the property pairs' held-out parts, pooled: agreement apart for yes and for no, per prompt
        res["hand_pairs_property"] = sum(len(got[n][0]) for n in props)
        res["hand_yes_property"] = sum(r["answer"] for n in props for r in got[n][0])
        res["held_out"] = {"pairs": sum(len(got[n][0]) for n in held), "yes": sum(r["answer"] for n in held for r in got[n][0]), "prompts": {}}
        for prompt in variants:
            rows, p = pool(held, prompt)
            crows, cp = pool(choose, prompt)
            t = best_threshold(crows, cp) if crows else 0.5
            at_half, at_t = summary(rows, p), summary(rows, p, t)
            fig = lambda s: {"agreement_yes": s["yes_rate_where_yes"], "agreement_no": round(1 - s["yes_rate_where_no"], 4)}  # noqa: E731
            res["held_out"]["prompts"][prompt] = {"at_0.5": fig(at_half), "threshold_chosen": t, "at_threshold": fig(at_t)}
            log(f"held-out property pairs, {prompt} prompt: yes {fig(at_half)['agreement_yes']} / no {fig(at_half)['agreement_no']} at 0.5; "
                f"at the threshold chosen on the other parts ({t:g}): yes {fig(at_t)['agreement_yes']} / no {fig(at_t)['agreement_no']}")
        d = res["held_out"]["prompts"][DEFAULT]["at_0.5"]
        res["agreement_yes"], res["agreement_no"] = d["agreement_yes"], d["agreement_no"]
        active = [(r, x) for n in props for r, x in zip(got[n][0], got[n][1][DEFAULT]) if r.get("active")]
        if active:
            res["yes_precision_property"] = {"by_hand": round(sum(r["answer"] for r, _ in active) / len(active), 4),
                                             "by_judge": round(sum(x > 0.5 for _, x in active) / len(active), 4), "active_pairs": len(active)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--judge", default="bundled:qwen2.5-coder-1.5b", help="llama.cpp model (bundled name, GGUF path or hub file)")
    ap.add_argument("--pairs", nargs="+", default=SETS, help="JSONL files of {text, question, answer}")
    ap.add_argument("--prompts", default=",".join(PROMPTS), help=f"comma-separated, of {', '.join(PROMPTS)}")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    prompts = tuple(a.prompts.split(","))
    if DEFAULT not in prompts or not set(prompts) <= set(PROMPTS):
        raise SystemExit(f"--prompts: a comma-separated subset of {', '.join(PROMPTS)} that includes {DEFAULT}")
    print(cpu_line())
    backend = LlamaCppBackend(LLMConfig(llamacpp=LlamaCppConfig(model=a.judge)))
    print(f"judge: {a.judge}")
    res = check(backend, a.pairs, prompts)
    res["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if "yes_precision_property" in res:
        y = res["yes_precision_property"]
        print(f"\nthe demo model's yes-precision on its {y['active_pairs']} active property pairs: by hand {y['by_hand']}, by the judge {y['by_judge']}")
    print("pooled agreement: " + ", ".join(f"{k} prompt {v}" for k, v in res["pooled"].items()) + f"; peak RSS {res['peak_rss_mb']} MB")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    if "held_out" in res:
        print(f"judge_hand_pairs_property: {res['hand_pairs_property']}")
        print(f"judge_agreement_yes: {res['agreement_yes']}")
        print(f"judge_agreement_no: {res['agreement_no']}")
    print(f"judge_agreement: {res['pooled'][DEFAULT]}")


if __name__ == "__main__":
    main()

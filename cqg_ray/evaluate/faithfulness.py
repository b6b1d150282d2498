"""Faithfulness: are the questions a model marks active for a text true of it? A judge LLM answers them.

    res = faithfulness(model, texts, FaithfulnessConfig(), out_dir="runs/x/evaluation")
    res["faithfulness_yes_precision"], res["faithfulness_inactive_yes_rate"], res["faithfulness_balanced_accuracy"]

Protocol (docs/evaluation.md):
1. a seeded sample of ``n`` texts (file order kept);
2. per text, a seeded random sample of at most ``per_text`` of the questions the model answers yes
   (``model.apply`` under its default budget: the answers a user reads in an explanation) and at most as many
   of those it answers no. Random, never the most confident: those would inflate the figure;
3. the judge answers each (text, question) with a plain prompt (``judge_messages``: the text, the question, "yes
   or no"), single-pass: P(yes) from its first reply token, yes when P(yes) > 0.5;
4. X = the judge's yes-rate on active questions (``faithfulness_yes_precision``), Y = its yes-rate on inactive
   ones (``faithfulness_inactive_yes_rate``), Z = (X + 1 - Y) / 2 (``faithfulness_balanced_accuracy``; chance 0.5).
Beside the figures: ``pairs`` explained pairs (a sampled text and its nearest sampled text by the model's binary
cosine, built by ``cqg_ray.explain.explanation`` as ``explain`` builds them), with the judge's verdict on each shown
shared question for both texts. Every judgement goes through the LLM ledger under ``<out_dir>/faithfulness``:
a rerun asks nothing twice, an interrupted one resumes.

The pure core (``sample_texts``, ``sample_questions``, ``figures``, ``nearest_pairs``) takes arrays; ``faithfulness``
adds the model, the judge and the ledger.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from cqg_ray.config import FaithfulnessConfig
from cqg_ray.explain import value_cosine

log = logging.getLogger("cqg_ray")

FIGURES = ("faithfulness_yes_precision", "faithfulness_inactive_yes_rate", "faithfulness_balanced_accuracy")


# ----------------------------------------------------------------------------------------- pure core


def sample_texts(n_texts: int, n: int, seed: int) -> np.ndarray:
    """Sorted indices of a seeded sample of at most n of n_texts texts."""
    if n >= n_texts:
        return np.arange(n_texts)
    return np.sort(np.random.default_rng(seed).choice(n_texts, size=n, replace=False))


def sample_questions(act: np.ndarray, per_text: int, seed: int) -> list[tuple[int, int, bool]]:
    """(row, question, active) triples: per row of ``act`` (n, m) bool, a seeded random sample of at most
    ``per_text`` active questions and at most ``per_text`` inactive ones; in row order, active ones first, each
    group by question index."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int, bool]] = []
    for row, yes in enumerate(np.asarray(act, dtype=bool)):
        for flag, pool in ((True, np.flatnonzero(yes)), (False, np.flatnonzero(~yes))):
            picked = np.sort(rng.choice(pool, size=min(per_text, len(pool)), replace=False)) if len(pool) else pool
            out += [(row, int(q), flag) for q in picked]
    return out


def figures(active_flags: list[bool] | np.ndarray, judge_yes: list[bool] | np.ndarray) -> dict[str, float | int | None]:
    """X, Y, Z of the module docstring from the (active?, judge said yes?) of each judgement (None where undefined)."""
    a = np.asarray(active_flags, dtype=bool)
    j = np.asarray(judge_yes, dtype=bool)
    n_act, n_inact = int(a.sum()), int((~a).sum())
    x = float(j[a].mean()) if n_act else None
    y = float(j[~a].mean()) if n_inact else None
    z = (x + 1 - y) / 2 if x is not None and y is not None else None
    return {"faithfulness_yes_precision": x, "faithfulness_inactive_yes_rate": y, "faithfulness_balanced_accuracy": z,
            "judged_active": n_act, "judged_inactive": n_inact}


def nearest_pairs(values: np.ndarray, k: int) -> list[tuple[int, int]]:
    """For the first k rows with an active question: (row, its nearest other row by the cosine of the budgeted value
    vectors; ties: the earlier row)."""
    act = np.asarray(values, dtype=np.float32)
    pairs: list[tuple[int, int]] = []
    for i in range(len(act)):
        if len(pairs) == k:
            break
        if not act[i].any() or len(act) < 2:
            continue
        scores = [value_cosine(act[i], act[j]) if j != i else -2.0 for j in range(len(act))]
        pairs.append((i, int(np.argmax(scores))))
    return pairs


# ----------------------------------------------------------------------------------------- with the model and the judge


def judge_identity(cfg: FaithfulnessConfig) -> str:
    """The judge in words: its backend and model (and single-pass engine for the embedded one)."""
    from cqg_ray.llm.base import resolve_engine

    j = cfg.judge
    if j.backend == "llamacpp":
        return f"llamacpp {j.llamacpp.model} (single-pass engine {resolve_engine(j.llamacpp.score_engine)})"
    model = {"openai": j.openai.model, "vllm": j.vllm.model, "fake": "fake"}[j.backend]
    return f"{j.backend} {model}" + (f" at {j.openai.base_url}" if j.backend == "openai" else "")


def faithfulness(model: Any, texts: list[str], cfg: FaithfulnessConfig, out_dir: str, seed: int = 0, backend: Any = None,
                 progress: bool = True) -> dict[str, Any]:
    """Run the protocol of the module docstring on ``texts`` for an interpretable ``model`` (``encode(output="probs")``,
    ``apply`` and ``explanation`` under its default budget, ``question_records``); ``backend``: a judge backend to use
    instead of the one ``cfg.judge`` names."""
    from cqg_ray.llm.backends import make_backend
    from cqg_ray.llm.base import Request
    from cqg_ray.llm.backends import stage_budget
    from cqg_ray.llm.fit import PromptFitter
    from cqg_ray.llm.prompts import clip_text, judge_messages
    from cqg_ray.llm.runner import run_requests
    from cqg_ray.rundir import RunDir

    t0 = time.time()
    rows = sample_texts(len(texts), cfg.n, seed)
    sample = [texts[i] for i in rows]
    probs = np.asarray(model.encode(sample, output="probs", progress=False), dtype=np.float32)
    act, values = model.apply(probs)
    records = model.question_records
    picks = sample_questions(act, cfg.per_text, seed)
    pairs = nearest_pairs(values, cfg.pairs)
    explained = [model.explanation(probs[i], probs[j]) for i, j in pairs]

    owns = backend is None
    backend = backend or make_backend(cfg.judge, in_process=True)
    try:
        fitter = PromptFitter(stage_budget(cfg.judge, backend), "faithfulness")
        cache: dict[tuple[int, int], int] = {}  # (row, question) -> request index
        requests: list[Request] = []

        def ask(row: int, q: int) -> int:
            if (row, q) not in cache:
                text = clip_text(sample[row], cfg.max_text_chars)
                req = fitter.text(text, lambda t: [Request(judge_messages(t, records[q]["text"]), max_tokens=1, yes_no=True,
                                                           meta={"row": int(rows[row]), "question": q})], what=f"text {int(rows[row])}")[0]
                cache[(row, q)] = len(requests)
                requests.append(req)
            return cache[(row, q)]

        sampled = [ask(r, q) for r, q, _ in picks]
        shown = [[(ask(i, s.index), ask(j, s.index)) for s in ex.shared_yes[: cfg.pair_questions]] for (i, j), ex in zip(pairs, explained)]
        log.info("faithfulness: %d texts, %d sampled judgements (+%d for %d explained pairs), judge %s", len(sample), len(picks),
                 len(requests) - len(set(sampled)), len(pairs), judge_identity(cfg))
        results = run_requests(requests, cfg.judge, RunDir(out_dir), stage="faithfulness", progress=progress, backend=backend)
    finally:
        if owns:
            backend.close()
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"faithfulness: the judge failed on {len(failed)} of {len(results)} judgements "
                           f"(first: {failed[0].error}); fix the judge and rerun (the ledger keeps the answered ones)")
    said = [bool(r.answers[0]) for r in results]
    p_yes = [float(r.p_yes[0]) for r in results]
    out: dict[str, Any] = figures([a for _, _, a in picks], [said[k] for k in sampled])
    out.update({
        "judge": judge_identity(cfg), "texts_in_file": len(texts), "texts": len(sample),
        "texts_without_active": int((~act.any(axis=1)).sum()), "active_per_text_mean": round(float(act.sum(axis=1).mean()), 3),
        "per_text": cfg.per_text, "seed": seed, "budget": model.budget.name, "prompt": fitter.report(),
        "seconds": round(time.time() - t0, 1),
        "judgements": [{"text": sample[r], "question": records[q]["text"], "question_index": q, "active": a,
                        "judge_yes": said[k], "p_yes": round(p_yes[k], 4)} for (r, q, a), k in zip(picks, sampled)],
        "pairs": [{"text_a": sample[i], "text_b": sample[j], "cosine": ex.cosine, "cognitive_load": ex.cognitive_load,
                   "shared": [{"index": s.index, "question": s.text, "judge_a": said[ka], "judge_b": said[kb]}
                              for s, (ka, kb) in zip(ex.shared_yes, verdicts)]}
                  for (i, j), ex, verdicts in zip(pairs, explained, shown)],
    })
    shared = [s["judge_a"] and s["judge_b"] for p in out["pairs"] for s in p["shared"]]
    out["pairs_shared_confirmed"] = round(float(np.mean(shared)), 4) if shared else None
    return out


def format_faithfulness(name: str, res: dict[str, Any]) -> str:
    """The plain lines printed for one model."""
    def f(v):
        return "n/a" if v is None else f"{v:.4f}"

    return "\n".join([
        f"faithfulness of {name}: {res['texts']} texts, {res['judged_active']} active + {res['judged_inactive']} inactive "
        f"judgements, judge {res['judge']}",
        *(f"{k}: {f(res[k])}" for k in FIGURES),
    ])

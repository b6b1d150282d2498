"""Faithfulness: are the questions a model marks active for a text true of it? A judge LLM answers them.

    res = faithfulness(model, texts, FaithfulnessConfig(), out_dir="runs/x/evaluation")
    res["faithfulness_yes_precision"], res["faithfulness_inactive_yes_rate"], res["faithfulness_balanced_accuracy"]

Protocol (docs/evaluation.md):
1. a seeded sample of ``n`` texts (file order kept);
2. per text, three pools of questions under the model's default budget (``model.apply``: the answers a user reads in
   an explanation): *active* (shown), *answered no* (P(yes) at or below the budget's threshold: its floor, tau for the
   tau rule, 0.5 for a floor of null) and *cap left out* (above the threshold, but the budget's cap did not show them);
   a seeded random sample of at most ``per_text`` from each. Random, never the most confident: those would inflate
   the figure;
3. the judge answers each (text, question) with its prompt after four worked examples (``judge_shot_messages``: the
   text, the question, "yes or no"; the examples raised its agreement with hand answers on property questions, held
   out, from 0.60 / 0.79 to 0.94 / 0.82 for yes / no: docs/evaluation.md), single-pass: P(yes) from its first reply
   token, yes when P(yes) > 0.5;
4. X = the judge's yes-rate on active questions (``faithfulness_yes_precision``), Y = its yes-rate on answered-no
   ones (``faithfulness_inactive_yes_rate``), Z = (X + 1 - Y) / 2 (``faithfulness_balanced_accuracy``; chance 0.5); the
   yes-rate on the cap's (``faithfulness_cap_left_out_yes_rate``) apart, since a budget leaves true questions out by
   design; beside them the mean active questions a text and the share of texts with none, so a figure bought by
   showing little shows. The old rule (inactive = every question not shown) is estimated from the same judgements,
   each text's answered-no and cap samples weighted by their pools (``faithfulness_old_rule_*``);
5. the links (``links``): the labelling LLM answers the same sampled pairs as it labelled (its prompt and threshold); the figures say
   how often it agrees with the judge, the head (P(yes) above the threshold) with it, and the budget (shown or not)
   with the head: which link loses how much;
6. where the model records the LLM that labelled its training texts (config.json ``labelled_by``) and the judge is
   that model (``same_model``), the result says so (``judge_is_labeller``) and the report warns: the heads learned
   that model's answers, errors included, and it confirms them (judge 0.85-0.93 where a person found 0.53-0.70 on the
   demo's 1.5B-labelled models: docs/evaluation.md); likewise when the links' labeller is not the model's. The links
   ask the recorded model (with its engine setting) where ``labeller`` is left at its default and the record names
   an embedded model, and with the recorded prompt and threshold where ``labeller_prompt`` and ``labeller_yes_above``
   are left at theirs (``with_links_labeller``).
The pure core (``sample_texts``, ``sample_pools``, ``protocol_figures``, ``link_figures``, ``nearest_pairs``) takes
arrays; ``faithfulness`` adds the model, the judge, the labeller and the ledger.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from cqg_ray.config import FaithfulnessConfig, llm_model_name
from cqg_ray.evaluate.data import sample_of
from cqg_ray.evaluate.markdown import figure, markdown_table, verdict
from cqg_ray.explain import value_cosine

log = logging.getLogger("cqg_ray")

FIGURES = ("faithfulness_yes_precision", "faithfulness_inactive_yes_rate", "faithfulness_balanced_accuracy")
MORE_FIGURES = ("faithfulness_cap_left_out_yes_rate", "faithfulness_mean_active", "faithfulness_texts_without_active_share",
                "faithfulness_old_rule_inactive_yes_rate", "faithfulness_old_rule_balanced_accuracy")
LINKS = ("faithfulness_link_labeller_judge", "faithfulness_link_head_labeller", "faithfulness_link_budget_head")
ACTIVE, NO, CAP = 0, 1, 2  # the pools of a text's questions: shown, answered no, above the threshold but cut by the cap


# ----------------------------------------------------------------------------------------- pure core


def sample_texts(n_texts: int, n: int, seed: int) -> np.ndarray:
    """Sorted indices of a seeded sample of at most n of n_texts texts."""
    if n >= n_texts:
        return np.arange(n_texts)
    return np.sort(np.random.default_rng(seed).choice(n_texts, size=n, replace=False))


def answered_threshold(budget) -> float:
    """The P(yes) at or below which the model answers a question no: the tau rule's tau, the top-k rule's floor, 0.5
    for a floor of null."""
    if budget.rule == "tau":
        return float(budget.tau)
    return 0.5 if budget.floor is None else float(budget.floor)


def pools(act: np.ndarray, probs: np.ndarray, threshold: float) -> np.ndarray:
    """(n, m) int8: each question's pool for each text, ACTIVE (shown), NO (P(yes) <= threshold) or CAP (above it, not
    shown). A shown question at or below the threshold (a budget without a floor) counts as ACTIVE."""
    act = np.asarray(act, dtype=bool)
    return np.where(act, ACTIVE, np.where(np.asarray(probs) > threshold, CAP, NO)).astype(np.int8)


def sample_pools(pool: np.ndarray, per_text: int, seed: int) -> list[tuple[int, int, int]]:
    """(row, question, pool) triples: per row of ``pool`` (n, m), a seeded random sample of at most ``per_text``
    questions of each pool; in row order, then ACTIVE, NO, CAP, each group by question index."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int, int]] = []
    for row, kinds in enumerate(np.asarray(pool)):
        for kind in (ACTIVE, NO, CAP):
            out += [(row, int(q), kind) for q in sample_of(rng, np.flatnonzero(kinds == kind), per_text)]
    return out


def protocol_figures(picks: list[tuple[int, int, int]], judge_yes, pool: np.ndarray, per_text: int) -> dict:
    """The figures of steps 4 of the module docstring from the sampled (row, question, pool) triples, the judge's
    answers on them and the pools (n, m)."""
    kind = np.array([k for _, _, k in picks], dtype=np.int8)
    row = np.array([r for r, _, _ in picks], dtype=np.int64)
    j = np.asarray(judge_yes, dtype=bool)
    rate = lambda mask: float(j[mask].mean()) if mask.any() else None  # noqa: E731
    x, y, cap = rate(kind == ACTIVE), rate(kind == NO), rate(kind == CAP)
    pool = np.asarray(pool)
    act = pool == ACTIVE
    # the old rule drew min(per_text, #not shown) of a text's questions not shown, uniformly: per text, the NO and CAP
    # samples' yes-rates weighted by their pools' sizes, texts weighted by what the old rule drew from them
    num = den = 0.0
    for r in range(len(pool)):
        sizes = {k: int((pool[r] == k).sum()) for k in (NO, CAP)}
        inactive = sizes[NO] + sizes[CAP]
        if not inactive:
            continue
        est = sum(sizes[k] * float(j[(row == r) & (kind == k)].mean()) for k in (NO, CAP) if sizes[k]) / inactive
        w = min(per_text, inactive)
        num, den = num + w * est, den + w
    old_y = num / den if den else None
    return {
        "faithfulness_yes_precision": x, "faithfulness_inactive_yes_rate": y,
        "faithfulness_balanced_accuracy": (x + 1 - y) / 2 if x is not None and y is not None else None,
        "faithfulness_cap_left_out_yes_rate": cap,
        "faithfulness_mean_active": round(float(act.sum(axis=1).mean()), 3) if len(pool) else None,
        "faithfulness_texts_without_active_share": round(float((~act.any(axis=1)).mean()), 4) if len(pool) else None,
        "faithfulness_old_rule_inactive_yes_rate": old_y,
        "faithfulness_old_rule_balanced_accuracy": (x + 1 - old_y) / 2 if x is not None and old_y is not None else None,
        "judged_active": int((kind == ACTIVE).sum()), "judged_inactive": int((kind == NO).sum()), "judged_cap_left_out": int((kind == CAP).sum()),
    }


def link_figures(kinds, judge_yes, labeller_yes) -> dict:
    """Which link loses how much, on the sampled pairs: the share of pairs where the labelling LLM agrees with the judge,
    the head (P(yes) above the threshold: ACTIVE or CAP) with the labelling LLM, and the budget (shown: ACTIVE) with
    the head; and down the chain, the share of each one's yes the judge confirms (labeller, head, shown)."""
    kind = np.asarray(kinds)
    judge, label = np.asarray(judge_yes, dtype=bool), np.asarray(labeller_yes, dtype=bool)
    head, shown = kind != NO, kind == ACTIVE
    agree = lambda a, b: float((a == b).mean()) if len(a) else None  # noqa: E731
    confirmed = lambda said: float(judge[said].mean()) if said.any() else None  # noqa: E731
    return {"faithfulness_link_labeller_judge": agree(label, judge), "faithfulness_link_head_labeller": agree(head, label),
            "faithfulness_link_budget_head": agree(shown, head),
            "judge_confirms_labeller_yes": confirmed(label), "judge_confirms_head_yes": confirmed(head),
            "judge_confirms_shown": confirmed(shown)}


def model_key(name: str) -> str:
    """A model name as the comparison of two LLMs sees it: without ``bundled:``, a path's folders or case."""
    return name.strip().removeprefix("bundled:").rstrip("/").rsplit("/", 1)[-1].lower()


def same_model(a: str, b: str) -> bool:
    """Whether two model names name the same model (``model_key``): e.g. bundled:qwen2.5-coder-1.5b and
    /models/Qwen2.5-Coder-1.5B; a served model under another name is not recognised."""
    return model_key(a) == model_key(b)


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
    return f"{j.backend} {llm_model_name(j)}" + (f" at {j.openai.base_url}" if j.backend == "openai" else "")


def labeller_identity(cfg: FaithfulnessConfig) -> str:
    """The labelling LLM in words: its backend, model and answer mode (and engine for the embedded one), and its prompt
    and threshold where they are not the defaults."""
    from cqg_ray.llm.base import resolve_engine

    lab = cfg.labeller
    asked = "".join([", the judge's prompt" if cfg.labeller_prompt == "judge" else "",
                     f", yes above {cfg.labeller_yes_above:g}" if cfg.labeller_yes_above != 0.5 else ""])
    if lab.backend == "llamacpp":
        return f"llamacpp {lab.llamacpp.model} ({lab.answer_mode}, engine {resolve_engine(lab.llamacpp.score_engine)}{asked})"
    return f"{lab.backend} {llm_model_name(lab)} ({lab.answer_mode}{asked})"


@contextmanager
def opened(llm, backend: Any = None):
    """``backend`` as given, or one made from ``llm`` and closed on leaving."""
    from cqg_ray.llm.backends import make_backend

    if backend is not None:
        yield backend
        return
    made = make_backend(llm, in_process=True)
    try:
        yield made
    finally:
        made.close()


def yes_answers(results: list, who: str, what: str, advice: str) -> list[bool]:
    """Each result's first yes/no; a clear error naming ``who`` when any failed (the ledger keeps the answered ones)."""
    failed = [r for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"faithfulness: {who} failed on {len(failed)} of {len(results)} {what} (first: {failed[0].error}); {advice}")
    return [bool(r.answers[0]) for r in results]


def faithfulness(model: Any, texts: list[str], cfg: FaithfulnessConfig, out_dir: str, seed: int = 0, backend: Any = None,
                 progress: bool = True, labeller: Any = None) -> dict[str, Any]:
    """Run the protocol of the module docstring on ``texts`` for an interpretable ``model`` (``encode(output="probs")``,
    ``apply`` and ``explanation`` under its default budget, ``question_records``); ``backend``: a judge backend to use
    instead of the one ``cfg.judge`` names; ``labeller``: a labelling backend instead of ``cfg.labeller``'s."""
    from cqg_ray.llm.base import Request
    from cqg_ray.llm.backends import stage_budget
    from cqg_ray.llm.fit import PromptFitter
    from cqg_ray.llm.prompts import clip_text, judge_shot_messages
    from cqg_ray.llm.runner import run_requests
    from cqg_ray.rundir import RunDir

    t0 = time.time()
    labelled_by = getattr(model, "labelled_by", None)  # a model folder trained before the record has none
    cfg = with_links_labeller(cfg, labelled_by)
    rows = sample_texts(len(texts), cfg.n, seed)
    if len(rows) < cfg.n:  # every text the files hold, fewer than asked
        log.info("faithfulness: judging all %d texts, fewer than n=%d (the files' texts, blank ones and repeats left out)", len(rows), cfg.n)
    sample = [texts[i] for i in rows]
    probs = np.asarray(model.encode(sample, output="probs", progress=False), dtype=np.float32)
    act, values = model.apply(probs)
    threshold = answered_threshold(model.budget)
    pool = pools(act, probs, threshold)
    records = model.question_records
    picks = sample_pools(pool, cfg.per_text, seed)
    swept = None
    if cfg.sweep_per_text:
        from cqg_ray.evaluate.faith_sweep import lowest_floor, sample_candidates, sweep_budgets

        budgets = sweep_budgets(model.budget, cfg.sweep_k, cfg.sweep_floors, model.mean is not None, cfg.sweep_lifts)
        floor = lowest_floor(budgets)
        candidates = sample_candidates(probs, floor, cfg.sweep_per_text, seed)
    pairs = nearest_pairs(values, cfg.pairs)
    explained = [model.explanation(probs[i], probs[j]) for i, j in pairs]

    with opened(cfg.judge, backend) as judge:
        fitter = PromptFitter(stage_budget(cfg.judge, judge), "faithfulness")
        cache: dict[tuple[int, int], int] = {}  # (row, question) -> request index
        requests: list[Request] = []

        def ask(row: int, q: int) -> int:
            if (row, q) not in cache:
                text = clip_text(sample[row], cfg.max_text_chars)
                req = fitter.text(text, lambda t: [Request(judge_shot_messages(t, records[q]["text"]), max_tokens=1, yes_no=True,
                                                           meta={"row": int(rows[row]), "question": q})], what=f"text {int(rows[row])}")[0]
                cache[(row, q)] = len(requests)
                requests.append(req)
            return cache[(row, q)]

        sampled = [ask(r, q) for r, q, _ in picks]
        shown = [[(ask(i, s.index), ask(j, s.index)) for s in ex.shared_yes[: cfg.pair_questions]] for (i, j), ex in zip(pairs, explained)]
        log.info("faithfulness: %d texts, %d sampled judgements (+%d for %d explained pairs), judge %s", len(sample), len(picks),
                 len(requests) - len(set(sampled)), len(pairs), judge_identity(cfg))
        if cfg.sweep_per_text:
            before = len(requests)
            swept = [ask(r, q) for r, q in candidates]
            log.info("faithfulness: budget sweep, %d budgets from %d judged questions above P(yes) %g (%d new)", len(budgets),
                     len(candidates), floor, len(requests) - before)
        results = run_requests(requests, cfg.judge, RunDir(out_dir), stage="faithfulness", progress=progress, backend=judge)
    said = yes_answers(results, "the judge", "judgements", "fix the judge and rerun (the ledger keeps the answered ones)")
    p_yes = [float(r.p_yes[0]) for r in results]
    judged = [said[k] for k in sampled]
    out: dict[str, Any] = protocol_figures(picks, judged, pool, cfg.per_text)
    labelled = None
    if cfg.links and picks:
        labelled = labeller_answers(sample, picks, records, cfg, out_dir, progress, labeller)
        out.update(link_figures([k for _, _, k in picks], judged, labelled))
    if swept is not None:
        from cqg_ray.evaluate.faith_sweep import choose, sweep_figures

        rows_ = sweep_figures(probs, model.mean, budgets, candidates, [said[k] for k in swept], floor)
        best = choose(rows_, cfg.sweep_min_active, cfg.sweep_max_without, cfg.sweep_min_judged)
        out["budget_sweep"] = {"floor": floor, "per_text": cfg.sweep_per_text, "judged": len(candidates), "min_active": cfg.sweep_min_active,
                               "max_without": cfg.sweep_max_without, "min_judged": cfg.sweep_min_judged, "chosen": best["budget"] if best else None,
                               "chosen_budget": budgets[rows_.index(best)].to_dict() if best else None,
                               "rows": rows_}
    kinds = {ACTIVE: "active", NO: "no", CAP: "cap"}
    out.update(labeller_checks(labelled_by, cfg, labelled is not None))
    out.update({
        "judge": judge_identity(cfg), "labeller": labeller_identity(cfg) if labelled is not None else None,
        "texts_in_file": len(texts), "texts": len(sample), "threshold": threshold,
        "texts_without_active": int((~act.any(axis=1)).sum()), "active_per_text_mean": round(float(act.sum(axis=1).mean()), 3),
        "per_text": cfg.per_text, "seed": seed, "budget": model.budget.name, "prompt": fitter.report(),
        "seconds": round(time.time() - t0, 1),
        "judgements": [{"text": sample[r], "question": records[q]["text"], "question_index": q, "pool": kinds[kd], "active": kd == ACTIVE,
                        "p": round(float(probs[r, q]), 4), "judge_yes": said[k], "p_yes": round(p_yes[k], 4),
                        **({} if labelled is None else {"labeller_yes": labelled[n]})}
                       for n, ((r, q, kd), k) in enumerate(zip(picks, sampled))],
        "pairs": [{"text_a": sample[i], "text_b": sample[j], "cosine": ex.cosine, "cognitive_load": ex.cognitive_load,
                   "shared": [{"index": s.index, "question": s.text, "judge_a": said[ka], "judge_b": said[kb]}
                              for s, (ka, kb) in zip(ex.shared_yes, verdicts)]}
                  for (i, j), ex, verdicts in zip(pairs, explained, shown)],
    })
    shared = [s["judge_a"] and s["judge_b"] for p in out["pairs"] for s in p["shared"]]
    out["pairs_shared_confirmed"] = round(float(np.mean(shared)), 4) if shared else None
    for caveat in caveats(out):
        log.warning("faithfulness: %s", caveat.removeprefix("warning: "))
    return out


def with_links_labeller(cfg: FaithfulnessConfig, labelled_by: dict | None) -> FaithfulnessConfig:
    """``cfg`` with the links asking as the model's labeller asked, from its record (``labelled_by``), where the settings
    are left at their defaults: where ``evaluate.faithfulness.labeller`` is, the embedded model the record names, with
    its answer mode and engine setting (a server's address is not in the record); where ``labeller_prompt`` and
    ``labeller_yes_above`` are, the record's prompt (single-pass answers) and threshold. Else ``cfg``."""
    from cqg_ray.config import FaithfulnessConfig, LLMConfig

    if not labelled_by:
        return cfg
    update: dict[str, Any] = {}
    lab = cfg.labeller
    if labelled_by.get("backend") == "llamacpp" and lab == LLMConfig():
        engine = {"score_engine": labelled_by["score_engine"]} if labelled_by.get("score_engine") else {}
        lab = lab.model_copy(update={"answer_mode": labelled_by.get("answer_mode", lab.answer_mode),
                                     "llamacpp": lab.llamacpp.model_copy(update={"model": labelled_by["model"], **engine})})
        update["labeller"] = lab
    default = FaithfulnessConfig()
    if cfg.labeller_prompt == default.labeller_prompt and lab.answer_mode == "single" and labelled_by.get("prompt", "answer") != "answer":
        update["labeller_prompt"] = labelled_by["prompt"]
    if cfg.labeller_yes_above == default.labeller_yes_above and labelled_by.get("yes_above") is not None:
        update["labeller_yes_above"] = float(labelled_by["yes_above"])
    return cfg.model_copy(update=update) if any(getattr(cfg, k) != v for k, v in update.items()) else cfg


def labeller_checks(labelled_by: dict | None, cfg: FaithfulnessConfig, links: bool) -> dict[str, Any]:
    """What the model's recorded labeller says of this judgement: ``labelled_by`` (the model's config.json record, or
    None), ``judge_is_labeller`` (None where unknown) and ``links_labeller_differs`` (the links asked another model
    than the one that labelled; None without links or record); ``caveats`` says them in words."""
    if not labelled_by:
        return {"labelled_by": None, "judge_is_labeller": None, "links_labeller_differs": None}
    own = labelled_by["model"]
    is_labeller = same_model(own, llm_model_name(cfg.judge))
    differs = (not same_model(own, llm_model_name(cfg.labeller))) if links else None
    return {"labelled_by": labelled_by, "judge_is_labeller": is_labeller, "links_labeller_differs": differs}


def labeller_answers(sample: list[str], picks: list[tuple[int, int, int]], records: list[dict], cfg: FaithfulnessConfig, out_dir: str,
                     progress: bool, backend: Any = None) -> list[bool]:
    """The labelling LLM's yes/no on each sampled (row, question), with the labelling prompt of its answer mode (one
    question a prompt), through the ledger under ``out_dir`` (stage ``faithfulness-labeller``)."""
    from cqg_ray.llm.answers import answer_requests, labelled_yes
    from cqg_ray.llm.prompts import clip_text
    from cqg_ray.llm.runner import run_requests
    from cqg_ray.rundir import RunDir

    questions = [r["text"] for r in records]
    lab = cfg.labeller
    requests = [answer_requests(clip_text(sample[r], cfg.max_text_chars), [q], questions, lab.answer_mode, 1, lab.max_tokens_answer,
                                meta={"row": r}, prompt=cfg.labeller_prompt)[0] for r, q, _ in picks]
    with opened(lab, backend) as labeller:
        log.info("faithfulness: the labelling LLM (%s) answers the %d sampled pairs", labeller_identity(cfg), len(requests))
        results = run_requests(requests, lab, RunDir(out_dir), stage="faithfulness-labeller", progress=progress, backend=labeller)
    said = yes_answers(results, "the labelling LLM", "pairs",
                       "rerun (the ledger keeps the answered ones), or leave the links out: evaluate.faithfulness.links=false")
    return [labelled_yes(q, r.p_yes[0] if r.p_yes else None, yes, cfg.labeller_yes_above) for q, r, yes in zip(requests, results, said)]


def format_faithfulness(name: str, res: dict[str, Any]) -> str:
    """The plain lines printed for one model."""
    return "\n".join([
        f"faithfulness of {name}: {res['texts']} texts, {res['judged_active']} active + {res['judged_inactive']} answered-no + "
        f"{res.get('judged_cap_left_out', 0)} cap-left-out judgements, judge {res['judge']}"
        + (f", labeller {res['labeller']}" if res.get("labeller") else ""),
        *(f"{k}: {figure(res[k])}" for k in FIGURES + MORE_FIGURES + LINKS if k in res),
        *caveats(res),
    ])


def caveats(res: dict[str, Any]) -> list[str]:
    """The warnings of ``labeller_checks`` as sentences, for the log, the printed lines and the report."""
    out = []
    if res.get("judge_is_labeller"):
        out.append(f"warning: the judge is the model that labelled this model's training texts ({res['labelled_by']['model']}): "
                   "the heads learned its answers, errors included, and it confirms them, so the yes precision above "
                   "overstates what a person finds; judge with another model (--judge) or check by hand "
                   "(bench/hand_check.py, docs/evaluation.md)")
    if res.get("links_labeller_differs"):
        out.append(f"warning: the links asked {res['labeller']}, not the model that labelled this model "
                   f"({res['labelled_by']['model']}): set evaluate.faithfulness.labeller to it")
    return out


def faithfulness_markdown(faith: dict) -> list[str]:
    """The report's faithfulness section: the figures table, the links table, each model's explained pairs."""

    if not faith:
        return []
    out = ["## Faithfulness: does a judge LLM confirm the questions the model marks active?", ""]
    rows, links = [], []
    for name, per in faith.items():
        for dataset, r in per.items():
            rows.append([name, dataset, str(r["texts"]), f"{r['judged_active']} / {r['judged_inactive']} / {r.get('judged_cap_left_out', 0)}",
                         *[figure(r.get(k)) for k in FIGURES], figure(r.get("faithfulness_cap_left_out_yes_rate")),
                         figure(r.get("faithfulness_old_rule_balanced_accuracy")), figure(r.get("faithfulness_mean_active")),
                         figure(r.get("faithfulness_texts_without_active_share")), figure(r.get("pairs_shared_confirmed"))])
            if r.get("faithfulness_link_labeller_judge") is not None:
                links.append([name, dataset, r["labeller"], *[figure(r.get(k)) for k in LINKS],
                              *[figure(r.get(k)) for k in ("judge_confirms_labeller_yes", "judge_confirms_head_yes", "judge_confirms_shown")]])
    out += [markdown_table(["Model", "texts file", "texts", "judged (active / answered no / cap left out)", "yes precision",
                            "answered-no yes-rate", "balanced accuracy", "cap-left-out yes-rate", "balanced accuracy, old rule",
                            "mean active", "texts without active", "shown shared questions confirmed for both texts"], rows), ""]
    if links:
        out += ["Where it is lost, on the same sampled pairs (agreement of each link; then the share of each one's yes the judge "
                "confirms):", "",
                markdown_table(["Model", "texts file", "labeller", "labeller = judge", "head = labeller", "budget = head",
                                "judge confirms labeller yes", "judge confirms head yes", "judge confirms shown"], links), ""]
    for name, per in faith.items():
        for dataset, r in per.items():
            out += [f"### {name} on {dataset}", "",
                    f"Judge: {r['judge']}. {r['texts']} of {r['texts_in_file']} texts; at most {r['per_text']} active, "
                    f"{r['per_text']} answered-no and {r['per_text']} cap-left-out questions per text, sampled at random (seed {r['seed']}); "
                    f"budget {r.get('budget', 'tau=' + str(r.get('tau')))} (answered no: P(yes) <= {r.get('threshold')}); "
                    f"{r['texts_without_active']} texts answer no question yes; {r['active_per_text_mean']} active questions per "
                    f"text on average. {r['seconds']} s.", ""]
            out += [x for c in caveats(r) for x in (f"**{c}**", "")]
            if r.get("budget_sweep"):
                from cqg_ray.evaluate.faith_sweep import sweep_markdown

                plot = r["budget_sweep"].get("plot")
                out += sweep_markdown(r["budget_sweep"]) + ([f"![budget sweep]({plot}.png)", ""] if plot else [])
            for k, p in enumerate(r["pairs"], 1):
                out += [f"**Pair {k}** (cosine {p['cosine']:.3f}, cognitive load {p['cognitive_load']})", "",
                        f"- A: {p['text_a']}", f"- B: {p['text_b']}", ""]
                if p["shared"]:
                    out += [markdown_table(["shared question", "judge on A", "judge on B"],
                                           [[s["question"], verdict(s["judge_a"]), verdict(s["judge_b"])] for s in p["shared"]]), ""]
                    if p["cognitive_load"] > len(p["shared"]):
                        out += [f"({p['cognitive_load'] - len(p['shared'])} more shared questions not shown)", ""]
    return out

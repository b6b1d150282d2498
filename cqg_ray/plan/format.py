"""Counts as people read them (``human``, ``parse_count``) and the plan as a terminal table (``format_plan``)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}


def parse_count(text: str | int) -> int:
    """'6.8M' -> 6800000, '10k' -> 10000, '5,000' -> 5000, '1e6' -> 1000000. A count must come out whole."""
    if isinstance(text, int):
        return text
    s = str(text).strip().replace(",", "").replace("_", "")
    suffix = s[-1:].lower() if s[-1:].isalpha() and s[-1:].lower() != "e" else ""
    if suffix and suffix not in _SUFFIX:
        raise ValueError(f"cannot read {text!r} as a count (suffixes: k, M, B)")
    try:
        value = Decimal(s[: len(s) - len(suffix)]) * _SUFFIX[suffix]
    except InvalidOperation:
        raise ValueError(f"cannot read {text!r} as a count (examples: 6.8M, 10k, 5000)") from None
    if value != value.to_integral_value() or value < 0:
        raise ValueError(f"{text!r} is not a whole, non-negative count")
    return int(value)


def human(n: float) -> str:
    """6800000 -> '6.8M' (3 significant digits)."""
    for div, s in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{s}"
    return f"{n:.3g}" if isinstance(n, float) and n != int(n) else str(int(n))


def hours(h: float) -> str:
    """Hours for a table cell: 0.90, 15.35; 100,000 and over as ``human`` does (185k, 3.7e+17 where a rate was tiny)."""
    return f"{h:.2f}" if h < 1e5 else human(h) if h < 1e15 else f"{h:.2g}"


def format_plan(p: dict) -> str:
    i, c, tp, t = p["inputs"], p["counts"], p["throughput"], p["totals"]
    lines = [
        f"cqg-ray plan: {c['docs']:,} texts, k = {c['clusters']:,} clusters, {i['method']} questions, "
        f"{i['gpus']} x {tp['device']} (+ {i['cpus']} CPU cores for k-means)",
        "",
        f"{'stage':<13} {'LLM requests':>13} {'prompt tok':>11} {'output tok':>11} {'texts enc':>10} {'device h':>9} {'wall h':>8}",
    ]

    def cell(v, fmt="{:,}"):
        return "-" if v is None else fmt.format(v)

    for r in p["stages"]:
        dev = "cpu" if r["cpu_core_hours"] is not None else hours(r["device_hours"])
        lines.append(f"{r['stage']:<13} {cell(r['llm_requests']):>13} {cell(r['prompt_tokens'] and human(r['prompt_tokens']), '{}'):>11} "
                     f"{cell(r['completion_tokens'] and human(r['completion_tokens']), '{}'):>11} "
                     f"{cell(r['texts_encoded'] and human(r['texts_encoded']), '{}'):>10} "
                     f"{dev:>9} {hours(r['wall_hours']):>8}")
    lines.append(f"{'total':<13} {t['llm_requests']:>13,} {human(t['prompt_tokens']):>11} {human(t['completion_tokens']):>11} "
                 f"{human(t['texts_encoded']):>10} {hours(t['gpu_hours']):>9} {hours(t['wall_hours']):>8}")
    if p.get("memory"):
        from cqg_ray.plan.memory import format_memory

        lines += ["", *format_memory(p["memory"])]
    lines += [
        "",
        f"k-means runs on the CPU: {hours(p['stages'][1]['cpu_core_hours'])} core-hours (from our faiss benchmark's flop rate)",
        f"questions: {c['clusters_generated']:,} clusters x {c['prompts_per_cluster']} prompt(s) x {i['questions_per_cluster']}"
        + (f" x {p['workload']['parse_rate']:.3g} parsed" if p["workload"]["parse_rate"] != 1 else "") + " = "
        f"{c['candidates']:,} candidates -> filters ({c['filter_survival']:.4g} kept) {c['eligible']:,} -> top t: "
        f"{c['selected_top_t']:,} -> after dedup ({c['dedup_survival']:.4f} kept): m = {c['questions']:,}",
        f"labelling: m x {c['texts_per_question']:,} texts = {c['label_pairs']:,} (text, question) pairs; at full packing "
        f"({c['label_questions_per_prompt_max']} per prompt, as the paper counts) "
        f"{c['label_prompts_full_packing']:,} prompts, {human(c['label_prompt_tokens_full_packing'])} prompt tokens",
        f"           our packing (estimate): {c['label_prompts']:,} prompts over {c['label_texts']:,} distinct texts "
        f"({c['label_questions_per_prompt']} questions per prompt)",
        f"           per question: ~{c['train_labels_per_question']:g} to train on, ~{c['heldout_select_per_question']:g} held out to "
        f"calibrate and select, ~{c['heldout_report_per_question']:g} for its shown figures (needs {c['min_heldout']}, "
        f"{c['min_heldout_yes']} of them yes"
        + ("; too few: raise label.n_* or train.holdout)" if c['heldout_report_per_question'] < c['min_heldout'] else ")"),
    ]
    tp_pair = c["label_prompt_tokens_per_pair"]
    lines.append("           prompt tokens per labelled pair (plan x answer mode; * = this config):")
    for name in ("corpus", "labelled"):
        if name in tp_pair:
            v = tp_pair[name]
            star = lambda mode: "*" if (name == c["label_random_from"] and mode == c["label_answer_mode"]) else " "  # noqa: E731
            what = "random texts from the corpus (before)" if name == "corpus" else "random texts from the labelled ones"
            lines.append(f"             {what:<40} {v['texts']:>11,} texts   packed {v['packed']:6.1f}{star('packed')}  "
                         f"single-pass {v['single']:6.1f}{star('single')}")
    if "floor" in tp_pair:
        f = tp_pair["floor"]
        lines.append(f"             floor of any plan with these quotas (each cluster with a question labels n_cluster texts of its own): "
                     f"{f['texts']:,} texts -> single-pass >= {f['single']:.1f}; a question's own line alone costs {f['single_without_texts']:.1f}")
    if "label_prompts_simulated" in c:
        lines.append(f"           our packing (simulated with make_label_plan on a balanced synthetic clustering): "
                     f"{c['label_prompts_simulated']:,} prompts over {c['label_texts_simulated']:,} texts")
    if "usd" in t:
        lines.append(f"LLM API cost at {i['usd_per_m_tokens'][0]:g} / {i['usd_per_m_tokens'][1]:g} USD per million prompt / output tokens: "
                     f"{t['usd']:,.2f} USD for all LLM stages; the labelling packed as the paper counts it ({c['label_questions_per_prompt_max']} "
                     f"questions a prompt) would cost {c['label_usd_full_packing']:,.2f} USD in place of this config's")
    ctx = p.get("context") or []
    if ctx:
        lines.append(f"prompt length against the engine's context ({ctx[0]['source']}: "
                     f"{'unknown until the run' if ctx[0]['context'] is None else format(ctx[0]['context'], ',') + ' tokens'}, minus the reply):")
        for r in ctx:
            lines.append(f"           {r['stage']:<13} mean ~{r['prompt_tokens_mean']:,} tokens, longest ~{r['prompt_tokens_longest']:,} "
                         f"(+{r['reply_tokens']:,} reply): {r['verdict']}")
        if "measured" in p and p["measured"]["stages"]:  # a calibrating run with no LLM stage done measured no prompts
            lines.append(f"           measured in {p['measured']['run']}: " + "; ".join(
                f"{k} {v['prompts_clipped']:,} of {v['prompts_checked']:,} prompts clipped, {v['texts_dropped']:,} texts dropped, "
                f"{v['chars_cut']:,} characters cut" for k, v in p["measured"]["stages"].items()))
    lines += [
        f"throughput per device: LLM {tp['llm_prompt_tokens_per_s']:,.0f} prompt tok/s + {tp['llm_completion_tokens_per_s']:,.0f} "
        f"output tok/s, encoder {tp['encoder_texts_per_s']:,.0f} texts/s, heads {tp['train_pairs_per_s']:,.0f} pairs/s"
        + (f"; the writer {tp['writer_prompt_tokens_per_s']:,.0f} prompt tok/s + {tp['writer_completion_tokens_per_s']:,.1f} output tok/s"
           if tp.get("writer_prompt_tokens_per_s") else ""),
        f"  ({tp['source']})",
        f"tokens: {p['workload']['prompt_tokens_per_text']:.4g} per text (clipped at max_text_chars), "
        f"{p['workload']['question_tokens']:g} per question, {p['workload']['answer_tokens']:g} per answer (assumptions)",
    ]
    if texts := p.get("measured", {}).get("texts"):
        lines.append(f"  (per text: measured in {p['measured']['run']}, {texts['mean_chars']:g} characters a text on average over "
                     f"{texts['read']:,} prepared texts, at {p['workload']['chars_per_token']:g} a token, unless --prompt-tokens-per-text gave it)")
    return "\n".join(lines)

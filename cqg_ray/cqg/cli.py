"""`cqg-ray questions RUN_DIR_OR_MODEL`: print or search the selected questions of a run directory, or a model folder's /
shipped model's questions; `--quality` measures them (``cqg_ray.cqg.quality``)."""

from __future__ import annotations

import os


def _is_model(target: str) -> bool:
    from cqg_ray.mbqa.folder import is_shipped_name

    return is_shipped_name(target) or os.path.exists(os.path.join(target, "questions.json"))


def quality_report(target: str, corpus: list[str] | None = None) -> dict:
    """The question-quality measures of a run's selected questions or a model's questions, against the corpus it read
    (a model: its run_config.yaml's corpus.paths; a run: its prepared corpus) or the given corpus files."""
    from cqg_ray.artifacts import load_corpus, load_question_embeddings, load_questions
    from cqg_ray.config import config_from_dict
    from cqg_ray.cqg.quality import corpus_texts, model_quality, question_quality
    from cqg_ray.encoder import load_encoder
    from cqg_ray.pipeline import saved_config
    from cqg_ray.rundir import RunDir

    if _is_model(target):
        return model_quality(target, corpus)
    run = RunDir(target)
    questions = load_questions(run).column("text").to_pylist()
    cfg = saved_config(run) or config_from_dict({})
    texts = corpus_texts(corpus) if corpus else load_corpus(run, ["text"]).column("text").to_pylist()
    emb = load_question_embeddings(run, cfg.encode.model, cfg.encode.backend, len(questions))
    if emb is None:  # a run from before the questions stage saved them
        emb = load_encoder(cfg.encode.model, backend=cfg.encode.backend).encode(questions, batch_size=128)
    return question_quality(questions, texts, emb, cfg.cqg.theta_value)


def model_questions(target: str) -> list[dict]:
    """A model's questions (folder or shipped name) as the run's rows: question_id, cluster, quality, text, and the
    model's own fields (precision, held-out labels, ...), in the model's dimension order."""
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    model = InterpretableEmbedder.load(target, load_encoder=False, device="cpu")
    return [{"question_id": q.get("id", str(i)), "cluster": q.get("cluster"), "quality": q.get("quality"), "text": q["text"],
             **{k: v for k, v in q.items() if k not in ("id", "cluster", "quality", "text")}}
            for i, q in enumerate(model.question_records)]


def cmd_questions(args) -> int:
    from cqg_ray.artifacts import load_questions
    from cqg_ray.config import ConfigError
    from cqg_ray.rundir import RunDir

    if not _is_model(args.run_dir) and not RunDir(args.run_dir).exists():
        from cqg_ray.mbqa.folder import shipped_models

        raise ConfigError(f"questions: no run directory or model at {args.run_dir} (shipped models: {', '.join(shipped_models()) or 'none'})")
    if not _is_model(args.run_dir):
        from cqg_ray.artifacts import not_a_run

        run = RunDir(args.run_dir)
        if what := not_a_run(run) or (None if run.exists("config.yaml") or run.exists("questions") else "no config.yaml, no questions stage"):
            raise ConfigError(f"questions: {args.run_dir} is not a run directory or a model ({what})")  # not "stage 'questions' has not finished"
    if args.corpus and not args.quality:
        raise ConfigError("questions: --corpus is the corpus --quality measures the copy rate against: add --quality")
    if args.quality:
        import json

        listing = [flag for flag, on in (("--search", args.search), ("--cluster", args.cluster is not None), ("--all", args.all),
                                         ("--limit", args.limit != 50)) if on]
        if listing:  # they choose which questions to list; the report measures them all
            raise ConfigError(f"questions: --quality measures every question; {', '.join(listing)} choose the ones to list: "
                              "give one or the other")
        from cqg_ray.cqg.quality import format_quality

        q = quality_report(args.run_dir, args.corpus)
        print(json.dumps(q, indent=1) if args.json else format_quality(q))
        return 0
    if args.limit < 1:
        raise ConfigError(f"questions: --limit/-n must be at least 1, got {args.limit}")
    if _is_model(args.run_dir):
        if args.all:
            raise ConfigError(f"questions: {args.run_dir} is a model, which keeps its selected questions only; --all reads a run directory")
        rows = model_questions(args.run_dir)
    else:
        run = RunDir(args.run_dir)
        t = load_questions(run)
        if args.all:
            t = run.read_table("questions/candidates.parquet").rename_columns(
                ["question_id" if n == "candidate_id" else n for n in run.read_table("questions/candidates.parquet").column_names])
        rows = t.to_pylist()
    if args.search:
        needle = args.search.lower()
        rows = [r for r in rows if needle in r["text"].lower()]
    if args.cluster is not None:
        rows = [r for r in rows if r["cluster"] == args.cluster]
    if args.json:
        import json

        print(json.dumps(rows[: args.limit], default=str, indent=1))
        return 0
    what = "candidate(s): candidate id, cluster, quality, what became of it" if args.all else "question(s)"
    print(f"{len(rows)} {what}" + (f" (showing {args.limit})" if len(rows) > args.limit else ""))
    for r in rows[: args.limit]:
        qv, cluster = r.get("quality"), "" if r.get("cluster") is None else r["cluster"]
        fate = f"[{candidate_fate(r)}] " if args.all else ""
        print(f"{r['question_id']:>6}  c{cluster:<5} q={qv:+.2f}  {fate}{r['text']}" if qv == qv and qv is not None
              else f"{r['question_id']:>6}  c{cluster:<5} q=  n/a  {fate}{r['text']}")
    return 0


def candidate_fate(row: dict) -> str:
    """What selection made of a candidate question (a row of candidates.parquet): kept, the filter that dropped it, a
    duplicate of a better one, or not among its cluster's top t."""
    if row.get("kept"):
        return "kept"
    if row.get("filtered"):
        return f"filter {row['filtered']}"
    dup = row.get("duplicate_of")
    return f"duplicate of {dup}" if dup is not None and dup >= 0 else "below top t"


def add_commands(sub) -> None:
    p = sub.add_parser("questions", help="print, search or measure the selected questions of a run or a model",
                       description="Print the questions selected by the cqg stage (best quality first), or search them; --quality "
                       "measures them (copy rate, words per question, cut-off share, top opening, near-duplicates).")
    p.add_argument("run_dir", metavar="RUN_DIR_OR_MODEL", help="a run directory, a model folder or a shipped model's name")
    p.add_argument("--quality", action="store_true", help="the question-quality report (docs/evaluation.md)")
    p.add_argument("--corpus", nargs="+", help="with --quality: corpus files for the copy rate (default: what the run or model read)")
    p.add_argument("--search", "-q", help="only questions containing this text (case-insensitive)")
    p.add_argument("--cluster", type=int, help="only questions generated for this cluster")
    p.add_argument("--all", action="store_true", help="a run directory: every parsed candidate, not only the selected ones")
    p.add_argument("--limit", "-n", type=int, default=50, help="questions to show (default 50)")
    p.add_argument("--json", action="store_true", help="JSON output")
    p.set_defaults(func=cmd_questions)

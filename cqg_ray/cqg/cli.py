"""`cqg-ray questions RUN_DIR`: print or search the selected questions."""

from __future__ import annotations


def cmd_questions(args) -> int:
    from cqg_ray.artifacts import load_questions
    from cqg_ray.rundir import RunDir

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
    print(f"{len(rows)} question(s)" + (f" (showing {args.limit})" if len(rows) > args.limit else ""))
    for r in rows[: args.limit]:
        qv = r.get("quality")
        print(f"{r['question_id']:>6}  c{r['cluster']:<5} q={qv:+.2f}  {r['text']}" if qv == qv and qv is not None
              else f"{r['question_id']:>6}  c{r['cluster']:<5} q=  n/a  {r['text']}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("questions", help="print or search the selected questions of a run",
                       description="Print the questions selected by the cqg stage (best quality first), or search them.")
    p.add_argument("run_dir")
    p.add_argument("--search", "-q", help="only questions containing this text (case-insensitive)")
    p.add_argument("--cluster", type=int, help="only questions generated for this cluster")
    p.add_argument("--all", action="store_true", help="every parsed candidate, not only the selected ones")
    p.add_argument("--limit", "-n", type=int, default=50)
    p.add_argument("--json", action="store_true", help="JSON output")
    p.set_defaults(func=cmd_questions)

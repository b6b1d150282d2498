"""`cqg-ray budget MODEL`: show or set a model folder's load budget, and measure its centring statistics.

    cqg-ray budget cqg-minilm-ref                                         # show the model's budget and whether it has statistics
    cqg-ray budget runs/demo/model --stats TRAINING.jsonl.gz --n 20000    # mean probabilities on training texts
    cqg-ray budget runs/demo/model --rule top_k --k 112 --floor 0.5 --value centred --rank centred

The statistics must come from the texts the model was trained on (or a sample of them), never from evaluation data.
Setting a budget or statistics makes the folder format version 2 (docs/mbqa.md#the-load-budget-mbqabudgetpy). It rewrites the
folder's config.json in place, so a shipped model named by its name is left alone: copy its folder and change the copy.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from cqg_ray.config import ConfigError


def mean_probabilities(model, texts: list[str]) -> np.ndarray:
    """(m,) float32: each question's mean probability over ``texts`` (the heads' own mean over the texts' embeddings,
    as the train stage measures it)."""
    return model.heads.mean_probabilities(model.encoder.encode(texts, normalize=model.normalize))


def cmd_budget(args) -> int:
    from cqg_ray.config import check_seed
    from cqg_ray.textfiles import DataError, load_texts, sample_indices
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.folder import is_shipped_name, resolve_model

    if args.n < 1:
        raise ConfigError(f"budget: --n must be at least 1 (texts sampled from --stats), got {args.n}")
    check_seed(args.seed)
    texts: list[str] = []
    if args.stats:  # read before the model and its encoder load: bad texts fail at once
        try:
            texts = load_texts(args.stats).texts
        except DataError as e:
            raise ConfigError(f"budget --stats: {e}") from None
        if not texts:
            raise ConfigError(f"budget --stats: no texts in {args.stats}")
    path = resolve_model(args.model)
    model = InterpretableEmbedder.load(path, load_encoder=bool(args.stats))
    changed = False
    if args.stats:
        rows = sample_indices(len(texts), args.n, args.seed)
        model.mean = mean_probabilities(model, [texts[i] for i in rows])
        model.stats_source = f"{len(rows)} texts of {args.stats} (seeded sample, seed {args.seed})"
        model.versioned_budget = True
        changed = True
        print(f"stats: mean probabilities of {len(rows)} texts of {args.stats} (median of the means: "
              f"{float(np.median(model.mean)):.3f})")
    updates = {k: v for k, v in {"rule": args.rule, "tau": args.tau, "k": args.k, "value": args.value, "rank": args.rank,
                                 "lift": args.lift}.items() if v is not None}
    if args.floor is not None:  # "none" removes the floor
        try:
            updates["floor"] = None if args.floor.lower() == "none" else float(args.floor)
        except ValueError:
            raise ConfigError(f"budget: floor must be a number in [0, 1) or none, got {args.floor!r}") from None
    if updates.get("rule") == "tau" and "tau" not in updates and model.budget.rule != "tau":
        updates["tau"] = float(model.tau)  # to the tau rule without --tau: the model's own tau (config.json)
    if updates:
        try:
            model.budget = model.budget.with_(**updates)
        except ValueError as e:
            raise ConfigError(str(e)) from None  # "budget lift must lie in (0, 1], got 2.0" (it read "budget: budget lift ...")
        if model.budget.rule == "top_k" and model.budget.k > model.m:
            raise ConfigError(f"budget: k must be at most the model's m={model.m}, got {model.budget.k}")
        model.versioned_budget = changed = True
    if model.budget.needs_mean and model.mean is None:
        raise ConfigError("centred values or ranking need the statistics: give --stats TRAINING_TEXTS")
    if changed and is_shipped_name(args.model):
        raise ConfigError(f"budget: {args.model} is a shipped model ({path}): copy its folder (cp -r {path} my-model) and set the "
                          "budget of the copy (cqg-ray budget my-model ...), or name the folder by its path to change it in place")
    if changed:
        model.save(path)
        print(f"wrote {path}/config.json (format version 2)")
    print(f"budget: {model.budget.name} ({model.budget.to_dict()}); statistics: {'yes' if model.mean is not None else 'none'}")
    return 0


EXPLAIN_HELP = """\
Embed two texts with a model and show their similarity (the cosine of their budgeted vectors), their cognitive load
(the questions both answer yes), the shared questions surest first and those only one text answers yes, each with
both probabilities and its labeller precision (InterpretableEmbedder.explain; over HTTP: POST /explain).

    cqg-ray explain cqg-minilm-ref "A man is playing a guitar." "Someone plays music on stage."
    cqg-ray explain runs/demo/model "first text" "second text" --k 32 --json
"""


def cmd_explain(args) -> int:
    """`cqg-ray explain MODEL TEXT_A TEXT_B`: `InterpretableEmbedder.explain` on the command line."""
    import json

    from cqg_ray.explain import format_explanation
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    if args.rows < 1:
        raise ConfigError(f"explain: --rows must be at least 1, got {args.rows}")
    if args.tau is not None and args.k is not None:
        raise ConfigError("explain: give --tau (the tau rule) or --k (top-k), not both")
    if args.tau is not None and not 0 < args.tau < 1:
        raise ConfigError(f"explain: --tau must be a number in (0, 1), got {args.tau!r}")
    model = InterpretableEmbedder.load(args.model, load_encoder=False)  # the encoder loads once the texts and budget pass
    if args.k is not None and not 1 <= args.k <= model.m:
        raise ConfigError(f"explain: --k must be an integer from 1 to m={model.m}, got {args.k!r}")
    try:
        ex = model.explain(args.text_a, args.text_b, args.tau, k=args.k)
    except ValueError as e:  # an empty text, a text that is not valid Unicode
        raise ConfigError(f"explain: {e}") from None
    print(json.dumps(ex.to_dict(), indent=2) if args.json else format_explanation(ex, args.text_a, args.text_b, args.rows))
    enc = model.encoder
    if cut := [name for name, text in (("A", args.text_a), ("B", args.text_b)) if enc.count_tokens([text]) >= enc.max_seq_length]:
        n = enc.max_seq_length
        print(f"note: text {' and '.join(cut)} filled the encoder's {n} tokens: words past its {n}th token were not read", file=sys.stderr)
    return 0


def add_commands(sub) -> None:
    e = sub.add_parser("explain", help="why two texts are similar: the questions both answer yes, and those only one does",
                       description=EXPLAIN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("model", help="model folder or shipped model name")
    e.add_argument("text_a")
    e.add_argument("text_b")
    e.add_argument("--k", type=int, help="at most k active questions per text (default: the model's budget)")
    e.add_argument("--tau", type=float, help="the tau rule instead of the budget: yes when p > tau, tau in (0, 1), valued as "
                                             "the model's budget values its answers (0/1, the paper's vectors, for value one)")
    e.add_argument("--rows", type=int, default=8, help="questions shown per list (default 8; --json shows all)")
    e.add_argument("--json", action="store_true", help="print the explanation as JSON (the fields of POST /explain but m)")
    e.set_defaults(func=cmd_explain)

    p = sub.add_parser("budget", help="show or set a model's load budget (which questions are active per text)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="model folder or shipped model name")
    p.add_argument("--rule", choices=["tau", "top_k"], help="tau: p > tau (the paper); top_k: the k most confident questions per text")
    p.add_argument("--tau", type=float, help="the tau rule's threshold")
    p.add_argument("--k", type=int, help="top_k: at most k active questions per text")
    p.add_argument("--floor", help="top_k: only questions with p > floor (a number in [0, 1), or none)")
    p.add_argument("--value", choices=["one", "prob", "centred"], help="what an active question holds: 1, p, or p minus its mean")
    p.add_argument("--rank", choices=["prob", "centred", "lift"], help="top_k: rank by p, by p minus the question's mean, or "
                   "lift: the questions above the floor by p minus --lift times the mean")
    p.add_argument("--lift", type=float, help="rank lift: the share of the mean taken off (0 < lift <= 1; default 0.5)")
    p.add_argument("--stats", metavar="TEXTS", help="measure the mean probabilities on these training texts (JSONL with a text field, or TSV)")
    p.add_argument("--n", type=int, default=20_000, help="texts sampled from --stats (seeded; default 20000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the --stats sample (default 0)")
    p.set_defaults(func=cmd_budget)

"""Record what the shipped model gives, for tests/test_shipped_model.py: run once when a model is shipped, never to make
a failing test pass.

    .venv/bin/python scripts/record_shipped_model.py              # models/cqg-minilm-ref -> tests/fixtures/shipped_model_expected.json

On torch float32 (the backend the tests pin): m, the default budget, four fixed texts, their probabilities (6 decimals)
and the number of questions the budget shows for each.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TEXTS = ["A man is playing a guitar.", "A man plays the guitar on stage.", "The central bank raised interest rates to fight inflation.",
         "Patients with migraine reported less pain after the treatment."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cqg-minilm-ref")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "shipped_model_expected.json"))
    a = ap.parse_args()
    from cqg_ray import InterpretableEmbedder

    model = InterpretableEmbedder.load(a.model, device="cpu", backend="torch-float32")
    probs = model.encode(TEXTS, output="probs", progress=False)
    act, _ = model.apply(probs)
    out = {"m": model.m, "budget": model.budget.to_dict(), "texts": TEXTS, "probs": [[round(float(p), 6) for p in row] for row in probs],
           "active": act.sum(axis=1).tolist()}
    Path(a.out).write_text(json.dumps(out))
    print(f"{a.out}: m {model.m}, budget {model.budget.name}, active {out['active']}")


if __name__ == "__main__":
    main()

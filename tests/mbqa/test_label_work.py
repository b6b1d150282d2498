"""The labelling stage's plan as a table (no Ray)."""

import numpy as np

from cqg_ray.config import LabelConfig
from cqg_ray.mbqa.label_plan import make_label_plan
from cqg_ray.mbqa.label_work import plan_table


def test_plan_table_has_every_pair_once_with_its_source_in_corpus_order():
    rng = np.random.default_rng(0)
    assignments = rng.integers(0, 6, 120)
    neighbors = np.array([[(c + i) % 6 for i in range(1, 4)] for c in range(6)])
    plan = make_label_plan(assignments, neighbors, np.array([0, 1, 2, 3, -1]), LabelConfig(n_cluster=8, n_neighbor=5, n_random=3, questions_per_prompt=4))
    doc_ids = np.array([f"d{i:03d}" for i in range(120)], dtype=object)
    shard, row = np.arange(120) % 3, np.arange(120) // 3
    t = plan_table(plan, doc_ids, shard, row)
    assert t.num_rows == plan.n_prompts
    assert list(zip(t.column("shard").to_pylist(), t.column("row").to_pylist())) == sorted(zip(t.column("shard").to_pylist(), t.column("row").to_pylist()))
    pairs = {}
    for d, qs, ss in zip(t.column("doc_id").to_pylist(), t.column("question_index").to_pylist(), t.column("source").to_pylist()):
        assert len(qs) <= 4
        for q, s in zip(qs, ss):
            pairs[(d, q)] = s
    want = {(doc_ids[d], int(q)): int(s) for q, d, s in zip(plan.pair_question, plan.pair_doc, plan.pair_source)}
    assert pairs == want and len(want) == plan.n_pairs

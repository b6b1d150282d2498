"""bench/head_decay.py's measure: each kept head's AUC on the report part of the held-out labels (no LLM, no training)."""

import numpy as np
import pyarrow as pa
import torch

from cqg_ray.config import config_from_dict, dump_config
from cqg_ray.mbqa.embedder import InterpretableEmbedder
from cqg_ray.mbqa.heads import StackedHeads
from cqg_ray.mbqa.stage import heldout_ids
from cqg_ray.rundir import RunDir, run_stage
from tests.scripts import load_script

decay = load_script("bench/head_decay.py", "bench_head_decay")


def test_report_aucs_reads_the_stages_report_part_and_skips_one_sided_questions(tmp_path):
    """Question 7 answered yes where its head's logit is above the median (AUC 1), question 8 the reverse (AUC 0),
    question 9 always yes (no AUC); labels outside the report part would each give 0.5 and must not count."""
    rng = np.random.default_rng(0)
    n, d = 200, 8
    cfg = config_from_dict({"run_dir": str(tmp_path)})
    run = RunDir(str(tmp_path))
    run.write_bytes("config.yaml", dump_config(cfg).encode())
    docs = np.array([f"d{i:03d}" for i in range(n)])
    emb = rng.standard_normal((n, d)).astype(np.float32)
    torch.manual_seed(0)
    heads = StackedHeads(d, 3)
    InterpretableEmbedder("any-encoder", [{"id": i, "text": f"Is it {i}?"} for i in (7, 8, 9)], heads, device="cpu").save(str(tmp_path / "model"))
    with torch.no_grad():
        logits = heads.forward_all(torch.from_numpy(emb / np.linalg.norm(emb, axis=1, keepdims=True))).numpy()
    _, report = heldout_ids(np.sort(docs), cfg.train)
    in_report = np.isin(docs, report)
    assert 0 < in_report.sum() < n
    above = logits > np.median(logits[in_report], axis=0)
    answers = {7: above[:, 0], 8: ~above[:, 1], 9: np.ones(n, dtype=bool)}
    noise = rng.random(n) < 0.5  # outside the report part the answers are coin flips
    rows = [(doc, q, bool(a[i]) if in_report[i] else bool(noise[i])) for q, a in answers.items() for i, doc in enumerate(docs)]
    labels = pa.table({"doc_id": [r[0] for r in rows], "question_id": [r[1] for r in rows], "answer": [r[2] for r in rows]})
    run_stage(run, "labels", "h", lambda ctx: run.write_table("labels/labels.parquet", labels), deps=[])
    emb_table = pa.table({"doc_id": docs, "embedding": pa.array(list(emb), pa.list_(pa.float32(), d))})
    run_stage(run, "encode", "h", lambda ctx: run.write_table("encode/part-00000.parquet", emb_table), deps=[])
    assert decay.report_aucs(str(tmp_path), str(tmp_path / "model")) == {7: 1.0, 8: 0.0}

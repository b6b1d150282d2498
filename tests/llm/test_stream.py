"""The streaming LLM stages' pure parts: the ledger's key index, counters, parts into one file (no Ray)."""

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from cqg_ray import progress
from cqg_ray.config import LLMConfig, PipelineConfig
from cqg_ray.llm.base import Request, backend_identity
from cqg_ray.llm.engines.fake import FakeBackend
from cqg_ray.llm.ledger import ACCOUNTING, KeyIndex, Ledger, binary_keys, index_totals, ledger_index, table_totals
from cqg_ray.llm.plan_work import PlanJob
from cqg_ray.llm.stream import add_counters, concat_parts, corpus_places, stream_plan, write_plan
from cqg_ray.rundir import ArtifactError, RunDir


def row(key: str, ok: bool = True) -> dict:
    return {"key": key, "text": "yes", "ok": ok, "answers": [True] if ok else None, "p_yes": [0.9] if ok else None, "attempts": 1}


def test_key_index_finds_keys_and_the_last_copy_of_a_key(tmp_path):
    run = RunDir(str(tmp_path))
    ledger = Ledger(run, "labels")
    a, b, c = ("a" * 64, "b" * 64, "c" * 64)
    assert len(KeyIndex.build(ledger)) == 0 and KeyIndex.build(ledger).find([a]).tolist() == [-1]
    ledger.append([row(b), row(a, ok=False)])
    ledger.append([row(c), row(a)])  # a answered later: the current row is in the second shard
    index = KeyIndex.build(ledger)
    pos = index.find([a, "d" * 64, c, b])
    assert pos[1] == -1 and len(index) == 3
    assert [index.shards[index.shard[p]] for p in pos[[0, 2, 3]]] == [ledger.shards()[1], ledger.shards()[1], ledger.shards()[0]]
    assert index.row[pos[0]] == 1 and index.ok[pos[0]]


def test_index_totals_equal_the_totals_of_every_row_read_with_its_key(tmp_path):
    run = RunDir(str(tmp_path))
    ledger = Ledger(run, "labels")
    a, b, c = ("a" * 64, "b" * 64, "c" * 64)
    assert index_totals(ledger, KeyIndex.build(ledger)) == table_totals(ledger.columns(ACCOUNTING))
    ledger.append([{**row(b), "prompt_tokens": 5, "completion_tokens": 1}, {**row(a, ok=False), "prompt_tokens": 7, "attempts": 3}])
    ledger.append([{**row(c), "prompt_tokens": 11, "attempts": 2}, {**row(a), "prompt_tokens": 13, "completion_tokens": 2}])
    expected = {"requests": 3, "prompt_tokens": 29, "completion_tokens": 3, "failures": 0, "retries": 1}  # a's failed row is not current
    assert index_totals(ledger, KeyIndex.build(ledger)) == table_totals(ledger.columns(ACCOUNTING)) == expected
    ledger.append([{**row(b, ok=False), "prompt_tokens": 17}])  # b failed on a retry: its current row
    index, totals = ledger_index(run.root_uri, "labels")
    assert totals == {**table_totals(ledger.columns(ACCOUNTING)), "recovered": 0}
    assert totals == {"requests": 3, "prompt_tokens": 41, "completion_tokens": 2, "failures": 1, "retries": 1, "recovered": 0}


def test_binary_keys_keep_the_hex_order_and_every_byte():
    hexes = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(500)] + ["ab" * 31 + "00", "ab" * 31 + "01", "00" * 32]
    b = binary_keys(pa.array(hexes))
    assert b.dtype == np.dtype("S32") and [bytes(x).ljust(32, b"\0").hex() for x in b] == hexes
    assert np.argsort(b, kind="stable").tolist() == np.argsort(np.array(hexes), kind="stable").tolist()
    assert b[-3] != b[-2] and len(np.unique(b)) == len(hexes)
    assert binary_keys(pa.array(["AB" * 32])) == binary_keys(pa.array(["ab" * 32]))
    with pytest.raises(ValueError, match="64 hex digits"):
        binary_keys(pa.array(["g" * 64]))
    with pytest.raises(pa.ArrowInvalid):
        binary_keys(pa.array(["ab"]))


def test_add_counters_sums_numbers_lists_and_nested_fits():
    total = {}
    add_counters(total, {"sent": 2, "answered": [1, 0, 2], "fit": {"checked": 3, "max_tokens_before": 40}})
    add_counters(total, {"sent": 5, "answered": [0, 1, 1], "fit": {"checked": 1, "max_tokens_before": 12}})
    assert total == {"sent": 7, "answered": [1, 1, 3], "fit": {"checked": 4, "max_tokens_before": 40}}


def test_concat_parts_streams_parts_into_one_file_in_name_order(tmp_path):
    import pyarrow as pa

    from cqg_ray.mbqa.label_work import FAILURES_SCHEMA, LABELS_SCHEMA

    run = RunDir(str(tmp_path))
    for g in (1, 0):
        run.write_table(f"labels/parts/labels-{g:09d}-x.parquet", pa.table({"doc_id": [f"d{g}"], "question_id": [g], "answer": [True],
                                                                            "p_yes": [0.5], "source": ["cluster"]}, schema=LABELS_SCHEMA))
    assert concat_parts(str(tmp_path), "labels", {"labels": LABELS_SCHEMA, "failures": FAILURES_SCHEMA}) == {"labels": 2, "failures": 0}
    assert run.read_table("labels/labels.parquet").column("doc_id").to_pylist() == ["d0", "d1"]
    assert run.read_table("labels/failures.parquet").num_rows == 0 and not run.exists("labels", "parts")


def test_corpus_places_finds_each_id_in_its_shard_and_names_the_missing(tmp_path):
    run = RunDir(str(tmp_path))
    run.write_table("prepare/part-000000.parquet", pa.table({"doc_id": ["a", "c", "e"], "text": ["ta", "tc", "te"]}))
    run.write_table("prepare/part-000001.parquet", pa.table({"doc_id": ["b", "d"], "text": ["tb", "td"]}))
    run.write_manifest("prepare", "h", [], {}, 0.0)
    shard, row = corpus_places(run, pa.array(["e", "b", "a", "d"]))
    assert shard.tolist() == [0, 1, 0, 1] and row.tolist() == [2, 0, 0, 1]
    shard, row = corpus_places(run, np.array(["d", "c"], dtype=object))  # numpy ids too
    assert shard.tolist() == [1, 0] and row.tolist() == [1, 1]
    with pytest.raises(ArtifactError, match="1 documents are not in the corpus shards"):
        corpus_places(run, pa.array(["a", "zz"]))


@pytest.mark.ray
def test_an_llm_pass_waits_for_an_engine_call_however_long_and_only_it(ray_local):
    """Ray Data fails a dataset with no output for 30 minutes; one engine call of a slow CPU takes longer (the reference
    build's first batch of generations did, 2026-11-27). The LLM passes' datasets wait; other datasets keep the bound."""
    import ray.data

    from cqg_ray.llm.stream import without_no_progress_timeout

    before = ray.data.DataContext.get_current().execution_no_progress_timeout_s
    assert before > 0
    ds = without_no_progress_timeout(ray.data.range(3))
    assert ds.context.execution_no_progress_timeout_s == -1
    assert sorted(r["id"] for r in ds.take_all()) == [0, 1, 2]  # it runs (Ray Data keeps no row order here)
    assert ray.data.DataContext.get_current().execution_no_progress_timeout_s == before
    assert ray.data.range(1).context.execution_no_progress_timeout_s == before


class PromptsJob(PlanJob):
    """Generation requests from the plan's own `text` column (no corpus), one reply part per batch."""

    plan = "plan/prompts.parquet"
    parts = {"replies": pa.schema([("text", pa.string())])}

    def requests(self, group: int):
        plan = self.read(group)
        return [Request([{"role": "user", "content": t}], max_tokens=40, yes_no=t.startswith("yes/no")) for t in plan.column("text").to_pylist()], plan

    def assemble(self, group, reqs, results, plan):
        self.write_part("replies", group, pa.table({"text": [(r or {}).get("text") or "" for r in results]}, schema=self.parts["replies"]))
        return {"replies": len(reqs)}


def test_a_streamed_stage_expects_its_unsent_requests_tokens_before_any_reply(tmp_path, monkeypatch):
    """The time left of a generation stage counts the tokens still to be written from its start (half of each unsent
    generation request's max_tokens, none for a single-pass one), not only the prompts to read: a writer deep in its
    decoding showed "~0s left" for minutes."""
    run = RunDir(str(tmp_path / "run"))
    texts = [f"write about {i}" for i in range(5)] + ["yes/no: is it 5?"]
    groups = write_plan(run, "gen/plan/prompts.parquet", pa.table({"text": texts}), 4)
    seen: list[float] = []

    class Recording(progress.View):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs.get("gen_per_request"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(progress, "View", Recording)
    llm = LLMConfig(backend="fake")
    job = PromptsJob(run.root_uri, "gen", "gen", PipelineConfig(llm=llm))
    done = stream_plan(job, groups, backend_identity(llm), backend=FakeBackend(llm))
    assert done["run"]["sent"] == 6 and done["assemble"]["replies"] == 6 and seen == [5 * 20 / 6]
    assert Request([{"role": "user", "content": "x"}], max_tokens=40, yes_no=True).expected_tokens == 0.0
    assert stream_plan(job, groups, backend_identity(llm), backend=FakeBackend(llm))["run"]["sent"] == 0 and len(seen) == 1  # nothing to send: no view


@pytest.mark.ray
def test_a_backend_kept_in_this_process_answers_a_stage_instead_of_ray_workers(tmp_path, ray_local):
    """With Ray running, a stage given no backend answers with the one `keep_backend` kept for its identity, in this
    process (the demo's engines, loaded once): every request reaches that instance; released, it is closed and gone."""
    from cqg_ray.llm.backends import keep_backend, kept_backend, release_backends

    run = RunDir(str(tmp_path / "run"))
    groups = write_plan(run, "gen/plan/prompts.parquet", pa.table({"text": [f"write about {i}" for i in range(6)]}), 4)
    llm = LLMConfig(backend="fake")
    job = PromptsJob(run.root_uri, "gen", "gen", PipelineConfig(llm=llm))
    kept = FakeBackend(llm)
    closed = []
    kept.close = lambda: closed.append(1)
    keep_backend(kept)
    try:
        assert kept_backend(backend_identity(llm)) is kept and kept_backend({"model": "another"}) is None
        done = stream_plan(job, groups, backend_identity(llm))
        assert done["run"]["sent"] == 6 and sorted(r.messages[0]["content"] for r in kept.calls) == [f"write about {i}" for i in range(6)]
    finally:
        release_backends()
    assert closed == [1] and kept_backend(backend_identity(llm)) is None

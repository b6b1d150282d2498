"""The ledger on its own: shards, the journal that covers the rows between shards, recovery after a kill."""

from cqg_ray.llm.ledger import JOURNAL, Ledger, totals
from cqg_ray.rundir import RunDir


def row(i: int, ok: bool = True) -> dict:
    return {
        "key": f"k{i}",
        "text": f"1. {'yes' if i % 2 else 'no'}\n",
        "ok": ok,
        "error": None if ok else "unreadable",
        "answers": [bool(i % 2)] if ok else None,
        "p_yes": [0.25 * (i % 4)] if ok else None,
        "prompt_tokens": 10 + i,
        "completion_tokens": 3,
        "attempts": 1 if ok else 3,
        "finished_at": "2026-11-21T00:00:00Z",
    }


def test_recorded_rows_are_readable_before_any_shard(tmp_path):
    ledger = Ledger(RunDir(str(tmp_path)), "labels")
    for i in range(3):
        ledger.record(row(i))
    # a second reader (a rerun after kill -9) sees them while the writer still holds the journal open
    again = Ledger(RunDir(str(tmp_path)), "labels")
    assert again.shards() == []
    assert again.load() == {f"k{i}": row(i) for i in range(3)}
    ledger.close()


def test_a_torn_last_line_is_skipped(tmp_path):
    run = RunDir(str(tmp_path))
    ledger = Ledger(run, "labels")
    ledger.record(row(0))
    ledger.record(row(1))
    ledger.close()
    path = tmp_path / "llm" / "ledger" / "labels" / JOURNAL
    with open(path, "ab") as f:
        f.write(b'{"key":"k2","text":"1. y')  # killed in the middle of a write
    assert sorted(Ledger(run, "labels").load()) == ["k0", "k1"]


def test_append_moves_the_journal_into_a_shard(tmp_path):
    run = RunDir(str(tmp_path))
    ledger = Ledger(run, "labels")
    rows = [row(i, ok=i != 2) for i in range(4)]
    for r in rows:
        ledger.record(r)
    ledger.append(rows)
    assert len(ledger.shards()) == 1
    assert not run.exists("llm/ledger/labels", JOURNAL)
    loaded = ledger.load()
    assert loaded == {r["key"]: r for r in rows}
    assert totals(loaded) == {"requests": 4, "prompt_tokens": 46, "completion_tokens": 12, "failures": 1, "retries": 2}
    ledger.record(row(9))  # the journal starts again after a shard
    assert sorted(Ledger(run, "labels").load()) == ["k0", "k1", "k2", "k3", "k9"]
    ledger.close()


def test_recover_puts_a_killed_runs_journal_in_a_shard(tmp_path):
    run = RunDir(str(tmp_path))
    killed = Ledger(run, "labels")
    killed.append([row(0)])
    killed.record(row(1))
    killed.record(row(2))  # never closed: the process "died" here
    rerun = Ledger(run, "labels")
    assert rerun.recover() == 2
    assert len(rerun.shards()) == 2
    assert not run.exists("llm/ledger/labels", JOURNAL)
    assert rerun.load() == {f"k{i}": row(i) for i in range(3)}
    assert rerun.recover() == 0
    assert len(rerun.shards()) == 2


def test_backend_identity_keys_what_changes_replies(tmp_path):
    from cqg_ray.config import LLMConfig, LlamaCppConfig, OpenAIConfig, VLLMConfig
    from cqg_ray.llm.base import Request, backend_identity
    from cqg_ray.llm.ledger import request_key

    plain = {"backend": "openai", "model": "local", "temperature": 0.0, "constrained": True}
    assert backend_identity(LLMConfig(backend="openai", openai=OpenAIConfig(model="local"))) == plain  # keys of plain configs unchanged
    sends = backend_identity(LLMConfig(backend="openai", openai=OpenAIConfig(model="local", send_grammar=True)))
    assert sends == {**plain, "sends": {"grammar": True, "structured_outputs": False}}
    assert backend_identity(LLMConfig(backend="openai", constrained=False,
                                      openai=OpenAIConfig(model="local", send_grammar=True))) == {**plain, "constrained": False}

    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + b"\x00" * 3_000_000)
    b.write_bytes(b"GGUF" + b"\x00" * 2_999_999 + b"\x01")  # same size, differs in the last MiB
    ida = backend_identity(LLMConfig(llamacpp=LlamaCppConfig(model=str(a))))
    assert ida["gguf"].startswith("3000004:")
    a.write_bytes(b.read_bytes())  # the same path, other weights
    assert backend_identity(LLMConfig(llamacpp=LlamaCppConfig(model=str(a))))["gguf"] != ida["gguf"]
    assert "gguf" not in backend_identity(LLMConfig())  # bundled: the name pins the sha256

    v = backend_identity(LLMConfig(backend="vllm", vllm=VLLMConfig(model="m", engine_kwargs={"dtype": "float16", "max_num_seqs": 4})))
    assert v["engine"] == {"dtype": "float16"}  # max_num_seqs does not change the replies
    assert "engine" not in backend_identity(LLMConfig(backend="vllm", vllm=VLLMConfig(model="m")))  # cuda, auto: keys as before
    from cqg_ray.hardware import pick_dtype

    on_cpu = backend_identity(LLMConfig(backend="vllm", vllm=VLLMConfig(model="m", device="cpu")))
    assert on_cpu["engine"] == {"dtype": pick_dtype()}  # the dtype the CPU resolved to keys the replies

    req = Request([{"role": "user", "content": "hi"}], 10)
    assert request_key(plain, req) != request_key(sends, req)


def test_columns_reads_the_keys_of_shards_and_every_journal(tmp_path):
    """A resume reads the key column (and what else it names), from the shards and from every writer's journal."""
    from cqg_ray.llm.ledger import latest, worker_journal

    run = RunDir(str(tmp_path))
    Ledger(run, "labels").append([row(0), row(1)])
    a, b = Ledger(run, "labels", journal=worker_journal()), Ledger(run, "labels", journal=worker_journal())
    a.record(row(2))
    b.record(row(3))
    b.record(row(1, ok=False))  # the same key again, later: the current row
    keys = Ledger(run, "labels").columns()
    assert keys.column_names == ["key"]
    assert sorted(keys.column("key").to_pylist()) == ["k0", "k1", "k1", "k2", "k3"]
    acct = latest(Ledger(run, "labels").columns(["ok"]))
    assert dict(zip(acct.column("key").to_pylist(), acct.column("ok").to_pylist())) == {"k0": True, "k1": False, "k2": True, "k3": True}
    assert Ledger(run, "labels").rows(["k1", "k3", "nope"]) == {"k1": row(1, ok=False), "k3": row(3)}
    a.close()
    b.close()


def test_batch_writer_writes_a_shard_every_n_rows_or_seconds_and_journals_the_rest(tmp_path):
    from cqg_ray.llm.ledger import BatchWriter, worker_journal

    run = RunDir(str(tmp_path))
    flushed = []
    w = BatchWriter(Ledger(run, "labels", journal=worker_journal()), flush_rows=3, flush_s=3600, on_flush=flushed.append)
    for i in range(7):
        w.add(row(i))
    assert len(Ledger(run, "labels").shards()) == 2 and [len(f) for f in flushed] == [3, 3]
    assert [r["key"] for r in Ledger(run, "labels").journal_rows()] == ["k6"]  # not in a shard yet: in the journal
    assert sorted(Ledger(run, "labels").load()) == [f"k{i}" for i in range(7)]
    t = BatchWriter(Ledger(run, "labels", journal=worker_journal()), flush_rows=10**6, flush_s=0.0)
    t.add(row(8))  # every row is past a zero-second deadline
    assert len(Ledger(run, "labels").shards()) == 3
    w.ledger.close()


def test_recover_moves_every_workers_journal_into_one_shard(tmp_path):
    from cqg_ray.llm.ledger import worker_journal

    run = RunDir(str(tmp_path))
    writers = [Ledger(run, "labels", journal=worker_journal()) for _ in range(3)]
    for i, w in enumerate(writers):  # killed: never closed, never flushed into a shard
        w.record(row(i))
        w.record(row(10 + i))
    rerun = Ledger(run, "labels")
    assert len(rerun.journals()) == 3
    assert rerun.recover() == 6
    assert len(rerun.shards()) == 1 and rerun.journals() == []
    assert sorted(rerun.load()) == sorted(f"k{i}" for i in (0, 1, 2, 10, 11, 12))


def test_compact_merges_small_shards_only_and_keeps_the_last_copy(tmp_path):
    run = RunDir(str(tmp_path))
    ledger = Ledger(run, "labels")
    ledger.append([row(i) for i in range(20)])  # a large shard (for small_rows=10)
    for i in range(5):
        ledger.append([row(i, ok=False)])  # small ones; k0..k4 now failed
    assert ledger.compact(min_shards=6, small_rows=10) == 6  # 5 small shards: fewer than 6, nothing merged
    assert ledger.compact(min_shards=5, small_rows=10) == 2
    loaded = ledger.load()
    assert len(loaded) == 20 and [loaded[f"k{i}"]["ok"] for i in range(6)] == [False] * 5 + [True]


def test_table_totals_count_the_last_row_of_each_key():
    import pyarrow as pa

    from cqg_ray.llm.ledger import SCHEMA, table_totals

    rows = [row(0), row(1), row(2, ok=False), row(2)]  # k2 failed, then answered
    t = pa.Table.from_pylist(rows, schema=SCHEMA).select(["key", "ok", "prompt_tokens", "completion_tokens", "attempts"])
    assert table_totals(t) == totals({r["key"]: r for r in rows}) == {"requests": 3, "prompt_tokens": 33, "completion_tokens": 9,
                                                                      "failures": 0, "retries": 0}


def test_a_damaged_ledger_is_named_or_skipped_and_its_accounting_starts_afresh(tmp_path, caplog):
    """A shard that cannot be read is an ArtifactError naming it; a journal line of other types is skipped as a torn one
    is; stats that are torn or of another shape start afresh with a warning (accounting only: the stage goes on)."""
    import json

    import pytest

    from cqg_ray.rundir import ArtifactError

    run = RunDir(str(tmp_path))
    ledger = Ledger(run, "labels")
    ledger.append([row(0), row(1)])
    ledger.record(row(2))
    ledger.close()
    folder = tmp_path / "llm" / "ledger" / "labels"
    with open(folder / JOURNAL, "a") as f:
        f.write(json.dumps({**row(3), "prompt_tokens": "many"}) + "\n" + json.dumps(row(4)) + "\n")
    assert sorted(Ledger(run, "labels").load()) == ["k0", "k1", "k2", "k4"]
    assert Ledger(run, "labels").columns(["ok"]).column("key").to_pylist() == ["k0", "k1", "k2", "k4"]
    for body in ("{torn", "[]", '{"totals": [], "runs": []}', '{"totals": {"wall_s": "x"}, "runs": []}'):
        (folder / "_stats.json").write_text(body)
        caplog.clear()
        assert ledger.read_stats() == {"stage": "labels", "totals": {}, "runs": []}
        assert "_stats.json cannot be read" in caplog.text and "the LLM accounting starts afresh" in caplog.text
    (shard,) = ledger.shards()
    data = (folder / shard).read_bytes()
    (folder / shard).write_bytes(data[: len(data) // 2])
    for read in (lambda: ledger.columns(), lambda: ledger.rows(["k0"])):  # what a resume and a stage read
        with pytest.raises(ArtifactError, match=f"{shard}.*move it aside to send its requests again"):
            read()
    with pytest.raises(ArtifactError, match=f"corrupt Parquet artifact .*{shard}"):
        ledger.load()

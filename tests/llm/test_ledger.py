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

    req = Request([{"role": "user", "content": "hi"}], 10)
    assert request_key(plain, req) != request_key(sends, req)

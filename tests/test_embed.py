"""Batch embedding: the pure helpers, the Ray Data pass with a real model folder, resume, settings guard, search, CLI;
and (slow) a 2-node cluster run killed midway and resumed, every input row exactly once."""

import contextlib
import json
import logging
import os
import signal
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cqg_ray.config import ConfigError, CorpusConfig, EmbedConfig
from cqg_ray.artifacts import EMBED_CORPUS, read_embed_output
from cqg_ray.artifacts import model_fingerprint
from cqg_ray.embed import _relative_names, actor_pool_size, embed
from cqg_ray.rundir import ArtifactError, RunDir


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):
    from cqg_ray.mbqa.toy import build_toy_model

    return build_toy_model(str(tmp_path_factory.mktemp("toy") / "model"))


@pytest.fixture(scope="module")
def model(toy_model):
    import torch

    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    torch.set_num_threads(1)
    return InterpretableEmbedder.load(toy_model, device="cpu")


@pytest.fixture(scope="module")
def mixed_corpus(tmp_path_factory, corpus_file):
    """The 400-line JSONL fixture plus a CSV with a repeated text and a TXT with an empty line (folder input)."""
    d = tmp_path_factory.mktemp("corpus")
    (d / "a.jsonl").write_bytes(corpus_file.read_bytes())
    (d / "b.csv").write_text("id,text\nr1,The doctor prescribed a new medicine.\nr2,The team won the final match.\n"
                             "r3,The doctor prescribed a new medicine.\n")
    (d / "c.txt").write_text("A recipe for bread with flour and water.\n\nThe river flooded the town.\n")
    return d


def test_actor_pool_size():
    # ((min, max) actors, GPUs per actor); a fixed cluster (nothing declared) keeps a fixed pool of the same size
    assert actor_pool_size(EmbedConfig(), {"CPU": 2}) == ((2, 2), 0.0)
    assert actor_pool_size(EmbedConfig(torch_threads=2), {"CPU": 8}) == ((4, 4), 0.0)
    assert actor_pool_size(EmbedConfig(), {"CPU": 16, "GPU": 4}) == ((4, 4), 1.0)
    assert actor_pool_size(EmbedConfig(num_actors=3, num_gpus_per_actor=0.5), {"GPU": 4}) == ((3, 3), 0.5)
    assert actor_pool_size(EmbedConfig(), {"CPU": 16, "GPU": 4}, {"CPU": 16, "GPU": 16}) == ((4, 16), 1.0)  # declared: grows
    # a GPU an actor on a local Ray that has none and declares none: said before any work (paper.yaml's embed section on
    # a CPU machine); a cluster's autoscaler may bring one, and declared GPUs are to come
    with pytest.raises(ConfigError, match=r"^num_gpus_per_actor 1: the local Ray has 0 GPU\(s\) and may grow to 0; set it to 0 "):
        actor_pool_size(EmbedConfig(num_gpus_per_actor=1), {"CPU": 2}, local=True)
    assert actor_pool_size(EmbedConfig(num_gpus_per_actor=1), {"CPU": 2}) == ((1, 1), 1.0)
    assert actor_pool_size(EmbedConfig(num_gpus_per_actor=1), {"CPU": 2}, {"CPU": 2, "GPU": 2}, local=True) == ((1, 2), 1.0)


def test_relative_names():
    assert _relative_names(["/data/x/a.jsonl"]) == ["a.jsonl"]
    assert _relative_names(["/data/x/a.jsonl", "/data/x/sub/b.csv"]) == ["a.jsonl", "sub/b.csv"]
    assert _relative_names(["s3://bucket/c/a.txt", "s3://bucket/c/b.txt"]) == ["a.txt", "b.txt"]


def test_model_fingerprint_follows_the_heads(toy_model, tmp_path):
    from cqg_ray.mbqa.toy import build_toy_model

    other = build_toy_model(str(tmp_path / "m2"), cut=0.2)
    assert model_fingerprint(toy_model) == model_fingerprint(toy_model)
    assert model_fingerprint(toy_model) != model_fingerprint(other)


def snapshot_texts(out):
    run = RunDir(out)
    t = run.read_table(EMBED_CORPUS)
    return t.column("doc_id").to_pylist(), t.column("text").to_pylist()


def test_embed_bits_resume_guard_and_search(ray_local, toy_model, model, mixed_corpus, tmp_path, capsys, caplog):
    out = str(tmp_path / "emb")
    cfg = EmbedConfig(unit_rows=60, batch_size=64)
    with caplog.at_level("WARNING", logger="cqg_ray"):
        m = embed(toy_model, [str(mixed_corpus)], out, cfg, CorpusConfig(id_column=None), progress=False)
    assert "embed: rows not embedded: empty 1" in caplog.text  # said, not only counted
    # 400 + 3 (the CSV repeat is a row of its own) + 2 (the empty line is dropped) rows
    assert m["counts"]["rows"] == 405 and m["counts"]["dropped_empty"] == 1 and m["counts"]["files"] == 3
    assert m["counts"]["units"] == 7 + 1 + 1 and m["counts"]["units_resumed"] == 0 and m["counts"]["embedded_now"] == 405
    assert (m["m"], m["output"], m["budget"], m["bytes_per_text"]) == (32, "bits", {"rule": "tau", "tau": 0.5, "value": "one"}, 4)
    c = m["counts"]  # the actors' time inside units, beside the pass's wall time: the rest is their start-up and idle time
    assert 0 < c["unit_seconds"] <= c["actors"] * c["wall_s"] + 0.01  # (both rounded to 0.01 s)
    assert json.loads(RunDir(out).read_bytes("_manifest.json")) == m

    ids, packed, meta = read_embed_output(out)
    snap_ids, texts = snapshot_texts(out)
    assert ids.tolist() == snap_ids and len(set(snap_ids)) == 405  # every row once, in input order
    assert packed.shape == (405, 4) and packed.dtype == np.uint8
    p = model.encode(texts, output="probs", progress=False)
    bits = np.unpackbits(packed, axis=1, count=32)
    clear = np.abs(p - 0.5) > 1e-3
    assert (bits == (p > 0.5))[clear].all()

    # resume: lose a unit file and the manifest (as a kill leaves it), plus a half-written temp file, and one unit file
    # damaged (cut short): both units are embedded again, the damaged one not taken as done
    run = RunDir(out)
    units = [n for n in run.ls(suffix=".parquet") if n.startswith("emb-")]
    lost = pq.ParquetFile(run.path(units[2])).metadata.num_rows
    damaged = pq.ParquetFile(run.path(units[4])).metadata.num_rows
    run.rm(units[2])
    run.write_bytes(units[4], run.read_bytes(units[4])[:200])
    run.rm("_manifest.json")
    run.write_bytes("emb-part-000000-000000999.parquet.tmp-dead", b"partial")
    with pytest.raises(ArtifactError, match="unfinished"):
        read_embed_output(out)
    with caplog.at_level("WARNING", logger="cqg_ray"):
        m2 = embed(toy_model, [str(mixed_corpus)], out, cfg, progress=False)
    assert f"unit file {run.path(units[4])} is damaged (not Parquet, or not its rows): written again" in caplog.text
    assert m2["counts"]["embedded_now"] == lost + damaged == 120 and m2["counts"]["units_resumed"] == 7
    ids2, packed2, _ = read_embed_output(out)
    assert ids2.tolist() == ids.tolist() and np.array_equal(packed2, packed)
    assert embed(toy_model, [str(mixed_corpus)], out, cfg, progress=False) == m2  # finished with these settings: skipped
    assert not [n for n in os.listdir(out) if ".tmp-" in n]
    assert RunDir(out).read_json("_settings.json")["backend"] == "auto"  # another backend would mix its units with these
    with pytest.raises(ArtifactError, match=r"other settings \(backend differ\)"):
        embed(toy_model, [str(mixed_corpus)], out, cfg.model_copy(update={"backend": "onnx-int8"}), progress=False)

    # other settings are refused, --force starts again
    with pytest.raises(ArtifactError, match="budget, output differ"):
        embed(toy_model, [str(mixed_corpus)], out, EmbedConfig(unit_rows=60, output="probs", tau=0.4), progress=False)
    assert read_embed_output(out)[0].tolist() == ids.tolist()  # untouched

    # search the output: the CLI and the in-memory index agree with a brute force over the unpacked bits
    from cqg_ray.cli import main
    from cqg_ray.explain import binary_cosine
    from cqg_ray.search import BinaryIndex, search

    query = "a new medicine from the doctor"
    hits = search(model, BinaryIndex.load(out), query, k=5)
    q = model.encode([query], progress=False)[0]
    brute = sorted(range(405), key=lambda i: (-binary_cosine(q, bits[i]), i))[:5]
    assert [h.doc_id for h in hits] == [ids[i] for i in brute]
    assert hits[0].questions == [model.questions[i] for i in hits[0].shared] and hits[0].score > 0
    assert main(["search", toy_model, out, query, "-k", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [h["doc_id"] for h in printed["hits"]] == [ids[i] for i in brute[:3]]
    assert printed["hits"][0]["text"] == texts[brute[0]]
    assert main(["search", toy_model, out, query, "-k", "2"]) == 0
    shown = capsys.readouterr().out
    assert "yes both" in shown and texts[brute[0]][:40] in shown
    # each shared question with its measured precision (the toy model has all three kinds: measured, unmeasured, none)
    recs = model.question_records
    assert hits[0].precision == [recs[i].get("precision") for i in hits[0].shared]
    assert hits[0].n_heldout == [recs[i].get("n_heldout") for i in hits[0].shared]
    assert printed["hits"][0]["precision"] == hits[0].precision
    listed = [ln.strip() for ln in shown.splitlines() if ln.strip().startswith("yes both")]
    want = []
    for h in hits[:2]:
        for i in h.shared:
            note = "" if recs[i].get("n_heldout") is None else (
                f"  (labeller precision unmeasured, {recs[i]['n_heldout']} held-out labels)" if recs[i]["precision"] is None
                else f"  (labeller precision {recs[i]['precision']:.2f}, {recs[i]['n_heldout']} held-out labels)")
            want.append(f"yes both  [{str(recs[i].get('id', i)):>4}] {recs[i]['text']}{note}")  # the id explain shows
    assert listed == want and any("precision 0." in ln for ln in listed)
    assert printed["hits"][0]["question_ids"] == [str(recs[i].get("id", i)) for i in hits[0].shared]
    # asked for every document: those that share no active question with the query (score 0) are not listed as hits
    scores = [binary_cosine(q, b) for b in bits]
    assert 0 < sum(s > 0 for s in scores) < 405  # else this checks nothing
    assert main(["search", toy_model, out, query, "-k", "405"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len([ln for ln in shown if ln[:5].strip().rstrip(".").isdigit()]) == sum(s > 0 for s in scores)
    assert shown[-1] == f"no other document shares an active question with the query ({sum(s == 0 for s in scores)} of the top 405 score 0)"

    # what search refuses, each with one line and exit 2: another model with the same m, no hits asked for, a unit file
    # gone since the output finished (it searched the rest silently before)
    from cqg_ray.mbqa.toy import build_toy_model

    other = build_toy_model(str(tmp_path / "other"), cut=0.2)
    assert m2["heads_fingerprint"] == model_fingerprint(toy_model, ("questions.json", "heads.safetensors"))
    for args, says in [([other, out, query], "was embedded by another model"), ([toy_model, out, query, "-k", "0"], "-k must be at least 1")]:
        assert main(["search", *args]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith("error: ") and says in last, last
    run.rm(units[0])
    assert main(["search", toy_model, out, query]) == 2
    assert "does not match its manifest" in capsys.readouterr().err


def test_embed_probs_with_id_column(ray_local, toy_model, tmp_path, capsys):
    from cqg_ray.cli import main
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    valued = str(tmp_path / "valued")  # the toy model valuing its answers by p, so that value and binary cosines differ
    shutil.copytree(toy_model, valued)
    assert main(["budget", valued, "--value", "prob"]) == 0
    model = InterpretableEmbedder.load(valued, device="cpu")
    assert model.budget.value == "prob"
    csv = tmp_path / "docs.csv"
    csv.write_text("key,body\nk1,The doctor prescribed a new medicine.\nk2,The team won the final match.\nk3,A film about a dog.\n")
    out = str(tmp_path / "probs")
    m = embed(valued, [str(csv)], out, EmbedConfig(output="probs"), CorpusConfig(text_column="body", id_column="key"), progress=False)
    assert m["counts"]["rows"] == 3 and m["bytes_per_text"] == 64
    ids, probs, meta = read_embed_output(out)
    assert ids.tolist() == ["k1", "k2", "k3"] and probs.dtype == np.float16 and meta["output"] == "probs"
    want = model.encode(["The doctor prescribed a new medicine.", "The team won the final match.", "A film about a dog."], output="probs", progress=False)
    assert np.allclose(probs.astype(np.float32), want, atol=1e-3)

    # searched by the model's own similarity: the cosine of the value vectors under the output's budget, as the
    # index of the same probabilities scores it (before, their 0/1 answers by popcounts)
    from cqg_ray.explain import binary_cosine
    from cqg_ray.mbqa.budget import apply_budget
    from cqg_ray.search import SparseIndex, load_index

    query = "a new medicine from the doctor"
    values = apply_budget(probs.astype(np.float32), model.budget, model.mean)[1]
    q = model.encode([query], output="sparse", progress=False).toarray()[0]
    cos = values @ q / np.maximum(np.linalg.norm(values, axis=1) * np.linalg.norm(q), 1e-30)
    index = load_index(out, mean=model.mean)
    assert isinstance(index, SparseIndex) and index.budget == model.budget
    capsys.readouterr()
    assert main(["search", valued, out, query, "-k", "3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [h["doc_id"] for h in hits] == [ids[i] for i in sorted(range(3), key=lambda i: (-cos[i], i))]
    assert [h["score"] for h in hits] == pytest.approx(sorted(cos, reverse=True), abs=1e-6)
    assert sorted(cos) != pytest.approx(sorted(binary_cosine(q > 0, v > 0) for v in values), abs=1e-3)
    assert [h["doc_id"] for h in hits] == [h.doc_id for h in index.search(q, 3)]

    # --tau: the tau rule, its answers valued as the stored budget values them (p here), as explain --tau and
    # encode(threshold=) value them; it had scored 0/1 answers, so search and explain gave one pair two cosines
    from cqg_ray.mbqa.budget import Budget

    tau_rule = Budget(rule="tau", tau=0.3, value="prob")
    values = apply_budget(probs.astype(np.float32), tau_rule, model.mean)[1]
    q = model.encode([query], output="sparse", threshold=0.3, progress=False).toarray()[0]
    cos = values @ q / np.maximum(np.linalg.norm(values, axis=1) * np.linalg.norm(q), 1e-30)
    assert main(["search", valued, out, query, "-k", "3", "--tau", "0.3", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert [h["score"] for h in hits] == pytest.approx(sorted(cos, reverse=True), abs=1e-6)
    assert sorted(cos) != pytest.approx(sorted(binary_cosine(q > 0, v > 0) for v in values), abs=1e-3)


@contextlib.contextmanager
def ray_data_abort_notes():
    """The messages Ray Data's executor logs meanwhile (``logged``), and those that pass the logger's filters (``shown``)."""
    from cqg_ray.log import RAY_DATA_ABORT_LOGGER

    logger, logged, shown = logging.getLogger(RAY_DATA_ABORT_LOGGER), [], []

    class Heard(logging.Filter):
        def filter(self, record):
            logged.append(record.getMessage())
            return True

    heard, handler = Heard(), logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())
    logger.filters.insert(0, heard)
    logger.addHandler(handler)
    try:
        yield logged, shown
    finally:
        logger.removeFilter(heard)
        logger.removeHandler(handler)


def test_embed_cli_and_bad_corpus(ray_local, toy_model, corpus_file, tmp_path, capsys, caplog):
    from cqg_ray.cli import main

    out = str(tmp_path / "cli")
    assert main(["embed", toy_model, str(corpus_file), out, "--unit-rows", "200", "--tau", "0.4"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["counts"]["rows"] == 400 and summary["budget"] == {"rule": "tau", "tau": 0.4, "value": "one"} and summary["counts"]["units"] == 2
    # the embed section of --config gives the defaults (it was listed by `config --keys` and read by nothing); --set and
    # the flags given win, --k in place of the section's tau
    conf = tmp_path / "embed.yaml"
    conf.write_text("embed:\n  output: sparse\n  unit_rows: 100\n  tau: 0.3\n")
    assert main(["embed", toy_model, str(corpus_file), str(tmp_path / "conf"), "--config", str(conf), "--set", "unit_rows=400"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["output"], summary["budget"]["rule"], summary["budget"]["tau"], summary["counts"]["units"]) == ("sparse", "tau", 0.3, 1)
    assert main(["embed", toy_model, str(corpus_file), str(tmp_path / "conf2"), "-c", str(conf), "--k", "3", "--output", "bits"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["output"], summary["budget"]["rule"], summary["budget"]["k"], summary["counts"]["units"]) == ("bits", "top_k", 3, 4)
    from cqg_ray.pipeline import started_ray

    assert started_ray()  # the session's Ray, started by this process
    assert main(["embed", toy_model, str(corpus_file), str(tmp_path / "gpu"), "--gpus-per-actor", "1"]) == 2  # a local Ray, no GPU
    assert "error: num_gpus_per_actor 1: the local Ray has 0 GPU(s) and may grow to 0; set it to 0" in capsys.readouterr().err
    assert main(["embed", toy_model, str(corpus_file), str(tmp_path / "conf3"), "--set", "batch_size"]) == 2
    assert capsys.readouterr().err == "error: --set batch_size: give KEY=VALUE, a key of the embed section, e.g. --set batch_size=256\n"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text field"}\n')
    with ray_data_abort_notes() as (logged, shown):
        assert main(["embed", toy_model, str(bad), str(tmp_path / "bad-out")]) == 2
    assert "no line has the text field 'text'" in capsys.readouterr().err
    # Ray Data logged its "set DataContext.max_errored_blocks" note before raising the task's error; the CLI's logging
    # drops it (cqg_ray.log), so the one-line error stands alone
    assert any("max_errored_blocks" in m for m in logged) and shown == []
    (tmp_path / "torn.parquet").write_bytes(b"PAR1 torn off")
    assert main(["embed", toy_model, str(tmp_path / "torn.parquet"), str(tmp_path / "torn-out")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'torn.parquet'}: not a readable Parquet file (" in err and "Traceback" not in err, err
    # the file mended: OUT held a snapshot only, nothing embedded, so the same command starts again (no --force)
    pq.write_table(pa.table({"text": ["now a readable file", "with two rows"]}), tmp_path / "torn.parquet")
    assert main(["embed", toy_model, str(tmp_path / "torn.parquet"), str(tmp_path / "torn-out")]) == 0
    assert json.loads(capsys.readouterr().out)["counts"]["rows"] == 2
    assert main(["embed", str(tmp_path / "nope"), str(corpus_file), str(tmp_path / "x")]) == 2
    assert "not a cqg-ray model" in capsys.readouterr().err
    for flag, value in [("--k", "0"), ("--tau", "2"), ("--unit-rows", "0"), ("--batch-size", "0")]:
        assert main(["embed", toy_model, str(corpus_file), str(tmp_path / "y"), flag, value]) == 2, flag
        err = capsys.readouterr().err
        assert "invalid configuration in the embed options:" in err and "Traceback" not in err, err
    assert not (tmp_path / "y").exists()
    assert main(["embed", toy_model, str(corpus_file), str(corpus_file)]) == 2
    assert f"OUT {corpus_file} is a file" in capsys.readouterr().err
    assert main(["embed", toy_model, str(corpus_file), str(corpus_file / "emb")]) == 2  # a file on its path: said before the lease
    assert f"error: OUT {corpus_file / 'emb'} is below the file {corpus_file}" in capsys.readouterr().err
    (tmp_path / "corp").mkdir()
    (tmp_path / "corp" / "a.jsonl").write_text('{"text": "a text"}\n')
    assert main(["embed", toy_model, str(tmp_path / "corp"), str(tmp_path / "corp" / "emb")]) == 2  # a rerun read its own units
    assert capsys.readouterr().err == (f"error: OUT {tmp_path / 'corp' / 'emb'} is inside the corpus folder {tmp_path / 'corp'}: its "
                                       "files would be read as corpus next time; give an OUT outside it\n")
    assert not (tmp_path / "corp" / "emb").exists()
    # a glob that takes an earlier output's files (a rerun read them as corpus, and --force then deleted the output)
    (tmp_path / "corp" / "out").mkdir()
    (tmp_path / "corp" / "out" / "emb-part-000000-000000000.jsonl").write_text('{"text": "an output"}\n')
    assert main(["embed", toy_model, str(tmp_path / "corp" / "**" / "*.jsonl"), str(tmp_path / "corp" / "out"), "--force"]) == 2
    assert capsys.readouterr().err == (f"error: the corpus paths match {tmp_path / 'corp' / 'out' / 'emb-part-000000-000000000.jsonl'}, "
                                       f"a file inside OUT {tmp_path / 'corp' / 'out'} (an earlier run's output): its files would be "
                                       "read as corpus; give an OUT outside what the corpus paths match\n")
    assert (tmp_path / "corp" / "out" / "emb-part-000000-000000000.jsonl").exists()  # --force deleted nothing
    for flag in ("--num-cpus", "--max-cpus", "--max-gpus"):  # were pydantic tracebacks, after OUT and its lease were made
        assert main(["embed", toy_model, str(corpus_file), str(tmp_path / "ray-out"), flag, "-1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: invalid configuration in the embed options:") and "Traceback" not in err, err
    assert not (tmp_path / "ray-out").exists()
    assert main(["embed", toy_model, str(corpus_file), str(corpus_file / "emb")]) == 2
    assert f"error: OUT {corpus_file / 'emb'} is below the file {corpus_file}: give a folder to write the embeddings to\n" in capsys.readouterr().err
    # a corpus path not found, or ids asked of a .txt file: one line before OUT is made (they came after Ray started,
    # ~8 s, and left OUT with its lease file; the .txt one named corpus.id_column, not the flag given)
    assert main(["embed", toy_model, str(tmp_path / "nope.jsonl"), str(tmp_path / "nope-out")]) == 2
    assert capsys.readouterr().err == f"error: corpus path not found: {tmp_path / 'nope.jsonl'}\n"
    (tmp_path / "lines.txt").write_text("a line\nanother line\n")
    assert main(["embed", toy_model, str(tmp_path / "lines.txt"), str(tmp_path / "txt-out"), "--id-column", "id"]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'lines.txt'}: a .txt file holds one text a line and no ids: drop "
                                       "--id-column ('id'), or give the ids in a jsonl, csv or parquet file\n")
    assert not (tmp_path / "nope-out").exists() and not (tmp_path / "txt-out").exists()
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": ""}\n{"text": "   "}\n')
    assert main(["embed", toy_model, str(blank), str(tmp_path / "blank-out")]) == 2
    assert f"nothing to embed in {blank}: no row has a text (dropped: empty 2)" in capsys.readouterr().err
    dup = tmp_path / "dupid.jsonl"  # --id-column ids must be unique: search would show one id's text for the other
    dup.write_text('{"id": "x", "text": "first text"}\n{"id": "y", "text": "second"}\n{"id": "x", "text": "third text"}\n')
    assert main(["embed", toy_model, str(dup), str(tmp_path / "dup-out"), "--id-column", "id"]) == 2
    assert "document id 'x' appears more than once (dupid.jsonl:1 and dupid.jsonl:3)" in capsys.readouterr().err
    mixed = tmp_path / "mixed.jsonl"  # rows that cannot be read are named by file:line, as prepare names them
    mixed.write_bytes(b'{"text": "a good row"}\n{oops\n{"text": 7}\n{"text": "caf\xe9 in Latin-1"}\n')
    with caplog.at_level("WARNING", logger="cqg_ray"):
        assert main(["embed", toy_model, str(mixed), str(tmp_path / "mixed-out")]) == 0
    assert f"embed: {mixed}:2: invalid JSON (" in caplog.text and f"embed: {mixed}:3: 'text' is not a string" in caplog.text
    assert "embed: rows not embedded: bad_json 1, not_text 1" in caplog.text
    assert "embed: 1 row(s) held bytes that are not UTF-8, replaced by U+FFFD (maybe another encoding, or binary; " \
           "corpus.invalid_utf8: reject drops such rows)" in caplog.text  # embedded, and said
    capsys.readouterr()

    # the corpus edited in place, same size: the output is not taken for done, and not resumed over a changed input
    edited = tmp_path / "edited.jsonl"
    edited.write_text('{"text": "hello world"}\n{"text": "second line"}\n')
    out2 = str(tmp_path / "edited-out")
    assert main(["embed", toy_model, str(edited), out2]) == 0
    capsys.readouterr()
    stat = edited.stat()
    edited.write_text('{"text": "jello world"}\n{"text": "second line"}\n')
    os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert main(["embed", toy_model, str(edited), out2]) == 2
    assert "files differ (an input file was added, removed or changed since, or the paths were given in another order)" in capsys.readouterr().err
    assert main(["embed", toy_model, str(edited), out2, "--force"]) == 0
    assert snapshot_texts(out2)[1] == ["jello world", "second line"]


def test_an_embed_unit_advances_the_progress_counter_every_few_hundred_texts(toy_model, model, tmp_path, monkeypatch):
    """A unit's texts are counted as they are embedded, PROGRESS_TEXTS at a time, not once per 4,096 (minutes on 2 cores
    for long documents); the unit's file is what one call over all its texts gives."""
    from cqg_ray.embed import PROGRESS_TEXTS, EmbedUnits

    counted = []
    monkeypatch.setattr("cqg_ray.mbqa.embedder.add_progress", lambda **k: counted.append(k["texts"]))
    actor = EmbedUnits(toy_model, str(tmp_path / "out"), "sparse", {"rule": "tau", "tau": 0.5, "value": "one"}, 64, 2)
    texts = [f"text number {i} " * (i % 9 + 1) for i in range(600)]
    actor.write_unit("emb-a.parquet", pa.array([str(i) for i in range(600)], pa.string()), texts)
    assert PROGRESS_TEXTS == 256 and counted == [256, 256, 88]
    actor.write_unit("emb-b.parquet", pa.array(["x", "y"], pa.string()), ["word " * 300, "short"])  # called directly, as a bench does
    meta = [pq.read_schema(tmp_path / "out" / n).metadata for n in ("emb-a.parquet", "emb-b.parquet")]
    assert [(m[b"cqg_ray.texts_counted"], m[b"cqg_ray.texts_at_token_limit"]) for m in meta] == [(b"600", b"0"), (b"2", b"1")]
    got = actor.run.read_table("emb-a.parquet")
    want = model.encode(texts, output="sparse", budget=actor.budget, batch_size=64, progress=False)
    assert got.column("indices").to_pylist() == [want[[i]].indices.tolist() for i in range(600)]


def test_embed_help_gives_the_defaults(capsys):
    from cqg_ray.cli import main

    with pytest.raises(SystemExit):
        main(["embed", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--unit-rows UNIT_ROWS rows per work unit, the resume granularity (default 10000)" in out
    assert "--threads THREADS torch threads per CPU actor, at least (default 1; more where fewer units than CPUs leave cores idle)" in out


def test_a_bad_k_tau_or_model_is_said_before_the_lease_and_ray(toy_model, tmp_path, capsys, monkeypatch):
    import cqg_ray.pipeline
    from cqg_ray.cli import main
    from cqg_ray.mbqa.toy import TOY_QUESTIONS

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(cqg_ray.pipeline, "init_ray", no_ray)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello"}\n')
    out, m = tmp_path / "out", len(TOY_QUESTIONS)
    for flags, says in ((["--k", str(m + 1)], f"error: --k must be from 1 to m={m} (the model's questions), got {m + 1}\n"),
                        (["--k", "3", "--tau", "0.5"], "error: give --k (top-k) or --tau (the tau rule), not both\n")):
        assert main(["embed", toy_model, str(corpus), str(out), *flags]) == 2, flags
        assert capsys.readouterr().err == says
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("{}\n")
    for where, what in ((tmp_path / "run", "a pipeline run directory (config.yaml)"), (toy_model, "a model folder (config.json)")):
        assert main(["embed", toy_model, str(corpus), str(where)]) == 2
        assert capsys.readouterr().err == f"error: OUT {where} is {what}: give a folder of its own to write the embeddings to\n"
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["_lease.lock", "config.yaml"]  # (a run's own lock file)
    nope = tmp_path / "nope"
    assert main(["embed", str(nope), str(corpus), str(out)]) == 2
    assert capsys.readouterr().err == f"error: not a cqg-ray model: no config.json in {nope} (path does not exist)\n"
    assert not out.exists()  # no _lease.lock, nothing written
    for kw, says in (({"k": m + 1}, f"k must be an integer from 1 to m={m}, got {m + 1}"),
                     ({"k": 3, "tau": 0.5}, "give threshold (the tau rule) or k (top-k), not both")):
        with pytest.raises(ValueError) as e:  # the Python API too: before Ray starts
            embed(toy_model, [str(corpus)], str(out), EmbedConfig(**kw))
        assert str(e.value) == says
    assert not out.exists()


def test_the_tokenizing_stage_gives_the_same_embeddings(ray_local, toy_model, corpus_file, tmp_path, capsys):
    """`--tokenize-stage on`: a CPU actor reads and tokenizes each unit in `chunk_plan`'s chunks, the model's actor runs
    the encoder and heads on the tokens; the outputs equal the actors' own tokenizing, row for row, value for value."""
    from cqg_ray.cli import main

    got = {}
    for mode in ("off", "on"):
        out = str(tmp_path / mode)
        assert main(["embed", toy_model, str(corpus_file), out, "--unit-rows", "150", "--output", "sparse",
                     "--tokenize-stage", mode]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["counts"]["tokenize_stage"] == (mode == "on") and summary["counts"]["units"] == 3
        assert {k: summary["counts"][k] for k in ("texts_counted", "texts_at_token_limit", "token_limit")} == {
            "texts_counted": 400, "texts_at_token_limit": 0, "token_limit": 256}  # counted by the model's actor either way
        got[mode] = read_embed_output(out)
    (ids_a, a, _), (ids_b, b, _) = got["off"], got["on"]
    assert ids_a.tolist() == ids_b.tolist() and len(ids_a) == 400
    assert a.shape == b.shape and (a != b).nnz == 0 and a.nnz > 400


def test_embed_sparse_parquet_round_trip_and_search(ray_local, toy_model, model, corpus_file, tmp_path, capsys):
    """--output sparse: list<uint16> indices and list<float16> values, the model's sparse output for every row, about 4
    bytes an active question on disk; search over it equals a brute force over the same vectors."""
    import pyarrow.parquet as pq

    from cqg_ray.cli import main
    from cqg_ray.explain import value_cosine
    from cqg_ray.search import SparseIndex, search

    out = str(tmp_path / "sparse")
    assert main(["embed", toy_model, str(corpus_file), out, "--output", "sparse", "--k", "5", "--unit-rows", "200"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["output"] == "sparse" and summary["budget"] == {"rule": "top_k", "k": 5, "floor": 0.5, "value": "one", "rank": "prob"}
    run = RunDir(out)
    part = run.path([n for n in run.ls(suffix=".parquet") if n.startswith("emb-")][0])
    schema = pq.read_schema(part)
    assert (schema.field("indices").type.value_type, schema.field("values").type.value_type) == (pa.uint16(), pa.float16())
    ids, X, meta = read_embed_output(out)
    _, texts = snapshot_texts(out)
    want = model.encode(texts, output="sparse", k=5, progress=False).toarray()
    p = model.encode(texts, output="probs", progress=False)
    top5 = np.sort(p, axis=1)[:, -6:]
    clear = ((np.abs(p - 0.5) > 1e-3).all(axis=1)) & (np.diff(top5, axis=1).min(axis=1) > 1e-3)  # no near ties at the 5th
    assert X.shape == (400, 32) and np.array_equal(X.toarray()[clear], want[clear])
    active = X.nnz / 400
    assert 0 < summary["bytes_per_text"] <= 4 * active + 16  # the indices and values columns, compressed
    assert summary["file_bytes_per_text"] > summary["bytes_per_text"]  # + doc_id and the footers

    index = SparseIndex.load(out)
    query = "a new medicine from the doctor"
    hits = search(model, index, query, k=7)
    q = model.encode([query], output="sparse", k=5, progress=False).toarray()[0]
    dense = X.toarray()
    brute = sorted(range(400), key=lambda i: (-value_cosine(q, dense[i]), i))[:7]
    assert [h.doc_id for h in hits] == [ids[i] for i in brute]
    assert [h.score for h in hits] == pytest.approx([value_cosine(q, dense[i]) for i in brute])
    assert hits[0].shared == np.flatnonzero((q != 0) & (dense[brute[0]] != 0)).tolist()
    assert main(["search", toy_model, out, query, "-k", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [h["doc_id"] for h in printed["hits"]] == [ids[i] for i in brute[:3]] and printed["budget"] == "top5>0.5"
    with pytest.raises(ValueError, match="the query is empty, or only whitespace and characters no encoder reads"):
        search(model, index, " ")
    assert main(["search", toy_model, out, "  "]) == 2
    assert "search: the query is empty, or only whitespace and characters no encoder reads" in capsys.readouterr().err
    for tau in ("2", "0", "nan"):  # a probability's bound: said, not a traceback
        assert main(["search", toy_model, out, query, "--tau", tau]) == 2
        assert capsys.readouterr().err == f"error: search: --tau must lie in (0, 1), got {float(tau)}\n"


TWO_NODES = textwrap.dedent('''
    import json, os, subprocess, sys
    import ray
    from ray.cluster_utils import Cluster
    from cqg_ray.config import EmbedConfig
    from cqg_ray.embed import embed

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    model, corpus, out, how = sys.argv[1:5]
    if how == "library":  # the driver itself runs embed() on the cluster
        ray.init(address=cluster.address, log_to_driver=False)
        from cqg_ray.pipeline import started_ray
        assert not started_ray()  # joined, not started: a cluster's GPUs may yet come
        ray.data.DataContext.get_current().enable_progress_bars = False
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        m = embed(model, [corpus], out, EmbedConfig(unit_rows=25, batch_size=32, num_actors=2), progress=False)
        print("RESULT", json.dumps(m["counts"]), flush=True)
        ray.shutdown()
    else:  # the job entrypoint, joining the cluster through RAY_ADDRESS as `ray job submit` does
        env = {**os.environ, "RAY_ADDRESS": cluster.address, "CQG_RAY_PROGRESS": "0"}
        job = subprocess.run([sys.executable, "-m", "cqg_ray.cli", "embed", model, corpus, out, "--unit-rows", "25", "--batch-size", "32",
                              "--actors", "2"], env=env, capture_output=True, text=True, timeout=500)
        print(job.stderr[-2000:], file=sys.stderr)
        print("RESULT", json.dumps(json.loads(job.stdout[job.stdout.index("{"):])["counts"]), flush=True)
    cluster.shutdown()
''')


@pytest.mark.slow
def test_two_nodes_killed_and_resumed(toy_model, model, corpus_file, tmp_path):
    """Run on a 2-node cluster, SIGKILL the whole run after a few units, then resume it through the job entrypoint
    (`python -m cqg_ray.cli embed` joining a 2-node cluster by RAY_ADDRESS): it finishes the rest, and the output holds every input
    row exactly once, equal to the model's own encode."""
    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "two_nodes.py"
    script.write_text(TWO_NODES)
    out = tmp_path / "emb"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)}
    args = [sys.executable, str(script), toy_model, str(corpus_file), str(out)]

    first = subprocess.Popen([*args, "library"], env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    deadline = time.time() + 400
    done = []
    while time.time() < deadline and first.poll() is None:
        done = [n for n in os.listdir(out) if n.startswith("emb-") and n.endswith(".parquet")] if out.exists() else []
        if len(done) >= 3:
            break
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and the Ray processes it started (one process group)
    log = first.communicate()[0]
    assert 3 <= len(done) < 16, log[-3000:]
    assert not (out / "_manifest.json").exists()

    second = subprocess.run([*args, "job"], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    line = [ln for ln in second.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, second.stdout[-3000:] + second.stderr[-3000:]
    counts = json.loads(line[0][7:])
    assert counts["rows"] == 400 and counts["units"] == 16
    assert counts["units_resumed"] >= 3 and counts["embedded_now"] == 400 - 25 * counts["units_resumed"]
    assert counts["nodes_used"] == 2

    ids, packed, _ = read_embed_output(str(out))
    snap_ids, texts = snapshot_texts(str(out))
    assert len(ids) == 400 and len(set(ids.tolist())) == 400 and ids.tolist() == snap_ids
    p = model.encode(texts, output="probs", progress=False)
    bits = np.unpackbits(packed, axis=1, count=32)
    clear = np.abs(p - 0.5) > 1e-3
    assert (bits == (p > 0.5))[clear].all()

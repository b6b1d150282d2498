"""Corpus ingestion: the pure parsers (no Ray) and the Ray `prepare` stage on real files."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cqg_ray.config import CorpusConfig
from cqg_ray.corpus import (CorpusError, clean_text, dedup_table, detect_format, list_files, parse_file, prepare,
                            read_bytes, rows_table, sample_key, text_hash)
from cqg_ray.artifacts import load_corpus
from cqg_ray.rundir import RunDir, run_stage


def cfg(**kw):
    return CorpusConfig(paths=["x"], **kw)


def test_clean_text():
    assert clean_text("  a b  ") == "a b"
    assert clean_text("   ") is None
    assert clean_text(" \u200b\ufeff\x00 ") is None and clean_text("\ufffd\u00ad") is None  # nothing an encoder reads
    assert clean_text("\u200bword") == "\u200bword"
    assert clean_text(None) is None
    assert clean_text(5) is None
    assert clean_text("abcdef", max_chars=3) == "abc"
    assert clean_text("ab", min_chars=3) is None
    assert clean_text("a\x00b") == "ab"


def test_detect_format():
    assert detect_format("a/b.jsonl.gz") == "jsonl"
    assert detect_format("b.TSV") == "tsv"
    assert detect_format("b.TSV.GZ") == "tsv"
    assert detect_format("b.parquet") == "parquet"
    with pytest.raises(CorpusError, match="cannot tell the format"):
        detect_format("b.xml")


def test_jsonl_empty_lines_broken_json_and_line_numbers():
    data = b'{"text": "one"}\n\n{"text": "   "}\n{broken\n{"text": "two"}\n[1, 2]\n'
    res = parse_file(data, "jsonl", "f.jsonl", cfg())
    assert res.texts == ["one", "two"]
    assert res.lines == [1, 5]
    assert res.dropped == {"empty": 2, "bad_json": 2}
    assert res.errors[0].startswith("f.jsonl:4: invalid JSON")
    assert res.errors[1] == "f.jsonl:6: expected a JSON object, got list"


def test_invalid_utf8_replace_and_reject():
    data = b'{"text": "caf\xe9"}\n{"text": "ok"}\n'
    rep = parse_file(data, "jsonl", "f", cfg(invalid_utf8="replace"))
    assert rep.texts == ["caf\ufffd", "ok"]
    assert rep.dropped == {"utf8_replaced": 1}
    rej = parse_file(data, "jsonl", "f", cfg(invalid_utf8="reject"))
    assert rej.texts == ["ok"]
    assert rej.dropped == {"invalid_utf8": 1}
    assert rej.errors[0].startswith("f:1: invalid UTF-8")


def test_unpaired_surrogates_follow_the_invalid_utf8_rule(tmp_path):
    """JSON's "\\ud800" escape is valid JSON but no UTF-8: such a text or id is replaced or rejected as invalid bytes are."""
    f = tmp_path / "s.jsonl"
    f.write_text('{"text": "\\ud800 broken surrogate", "id": "a"}\n{"text": "ok", "id": "b\\udfff"}\n'
                 '{"text": "a pair \\ud83d\\ude00", "id": "c"}\n{"text": "x \\udc00\\ud800", "id": "d"}\n')
    data = read_bytes(str(f))
    rep = parse_file(data, "jsonl", str(f), cfg(id_column="id", invalid_utf8="replace"))
    assert rep.texts == ["\ufffd broken surrogate", "ok", "a pair \U0001f600", "x \ufffd\ufffd"]
    assert rep.ids == ["a", "b\ufffd", "c", "d"]
    assert rep.dropped == {"utf8_replaced": 3} and rep.errors == []
    table = rows_table(rep, "s.jsonl", dedup=False)
    assert table.column("text").to_pylist() == rep.texts and table.column("doc_id").to_pylist() == rep.ids
    rej = parse_file(data, "jsonl", str(f), cfg(id_column="id", invalid_utf8="reject"))
    assert rej.texts == ["a pair \U0001f600"] and rej.ids == ["c"] and rej.lines == [3]
    assert rej.dropped == {"invalid_utf8": 3}
    assert rej.errors == [f"{f}:1: 'text' is not valid Unicode (an unpaired surrogate at character 0); row rejected",
                          f"{f}:2: the id 'id' is not valid Unicode (an unpaired surrogate at character 1); row rejected",
                          f"{f}:4: 'text' is not valid Unicode (an unpaired surrogate at character 2); row rejected"]
    assert rows_table(rej, "s.jsonl", dedup=False).num_rows == 1
    arr = tmp_path / "s.json"  # a JSON array of objects, and MEDI2 lines, go through the same rule
    arr.write_text('[{"text": "\\ud800 x"}, {"text": "ok"}, {"text": "\\ud800"}]')
    parsed = parse_file(read_bytes(str(arr)), "jsonl", str(arr), cfg())
    assert parsed.texts == ["\ufffd x", "ok"]  # the third, U+FFFD alone once replaced, holds nothing to read: dropped as empty
    assert parsed.dropped == {"utf8_replaced": 2, "empty": 1}
    medi2 = parse_file(b'{"pos": [["instr", "p \\ud800"]], "neg": [["instr", "n"]]}\n', "medi2", "m", cfg(invalid_utf8="reject"))
    assert medi2.texts == ["n"] and medi2.dropped == {"invalid_utf8": 1}


def test_missing_column_is_a_clear_error():
    with pytest.raises(CorpusError, match="no line has the text field 'body'"):
        parse_file(b'{"text": "a"}\n', "jsonl", "f", cfg(text_column="body"))
    with pytest.raises(CorpusError, match=r"no column 'body' \(columns: text, x\)"):
        parse_file(b"text,x\na,1\n", "csv", "f", cfg(text_column="body"))


def test_an_id_column_gives_every_row_an_id_or_rejects_it():
    res = parse_file(b'{"text": "a", "id": 1}\n{"text": "b"}\n{"text": "c", "id": null}\n{"text": "d", "id": " "}\n', "jsonl", "f", cfg(id_column="id"))
    assert res.texts == ["a"] and res.ids == ["1"]
    assert res.dropped == {"missing_id": 3}
    assert res.errors == [f"f:{i}: no 'id' id (null or empty); row rejected" for i in (2, 3, 4)]
    with pytest.raises(CorpusError, match="f: no line has the id field 'key'; first problem: f:1: no 'key' id"):
        parse_file(b'{"text": "a", "id": 1}\n', "jsonl", "f", cfg(id_column="key"))
    with pytest.raises(CorpusError, match=r"no id column 'key' \(columns: text, id\)"):
        parse_file(b"text,id\na,1\n", "csv", "f", cfg(id_column="key"))
    assert parse_file(b"text,id\na,1\nb,\n", "csv", "f", cfg(id_column="id")).dropped == {"missing_id": 1}
    import io

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": ["x", "y"], "id": [None, 5]}), buf)
    res = parse_file(buf.getvalue(), "parquet", "f", cfg(id_column="id"))
    assert (res.texts, res.ids, res.dropped) == (["y"], ["5"], {"missing_id": 1})
    assert parse_file(b'{"text": "a"}\n', "jsonl", "f", cfg()).ids == [None]  # no id column: ids come from the text


def test_a_corrupt_parquet_file_is_a_clear_error():
    import io

    buf = io.BytesIO()
    pq.write_table(pa.table({"text": ["x", "y"]}), buf)
    for data in (buf.getvalue()[:-20], b"PAR1 not parquet", b""):
        with pytest.raises(CorpusError, match=r"^f: not a readable Parquet file \("):
            parse_file(data, "parquet", "f", cfg())


def test_a_damaged_gzip_is_a_clear_error_and_a_byte_order_mark_is_dropped(tmp_path):
    """A gzip whose deflate stream is damaged (zlib.error, not a truncation's EOFError) is named; a UTF-8 BOM does not
    make the first JSON line invalid nor rename the first CSV column."""
    from cqg_ray.corpus import read_bytes

    data = bytearray(gzip.compress(b"".join(b'{"text": "row %d of the corpus"}\n' % i for i in range(200))))
    data[40:60] = bytes(20)
    (tmp_path / "damaged.jsonl.gz").write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=r"damaged.jsonl.gz: corrupt gzip file \(Error -3 while decompressing data"):
        read_bytes(str(tmp_path / "damaged.jsonl.gz"))
    (tmp_path / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "first row"}\n{"text": "second row"}\n')
    assert parse_file(read_bytes(str(tmp_path / "bom.jsonl")), "jsonl", "f", cfg()).texts == ["first row", "second row"]
    (tmp_path / "bom.csv").write_bytes(gzip.compress(b"\xef\xbb\xbftext,id\nhello there,1\n"))
    assert parse_file(read_bytes(str(tmp_path / "bom.csv")), "csv", "f", cfg(id_column="text")).texts == ["hello there"]


def test_a_json_array_and_utf16_text_are_read(tmp_path):
    from cqg_ray.corpus import read_bytes

    arr = b'[\n {"text": "one"},\n {"text": "two"},\n 7,\n {"text": "three"}\n]\n'
    res = parse_file(arr, "jsonl", "a.json", cfg())
    assert res.texts == ["one", "two", "three"] and res.lines == [1, 2, 4]
    assert res.errors == ["a.json:3: expected a JSON object, got int"]
    assert parse_file(b'["not", "an array file"]\n{"text": "x"}\n', "jsonl", "b", cfg()).texts == ["x"]  # JSON Lines, first line an array
    (tmp_path / "u16.txt").write_bytes("héllo wörld\nsecond line ünïcode\n".encode("utf-16"))
    assert parse_file(read_bytes(str(tmp_path / "u16.txt")), "txt", "u16", cfg()).texts == ["héllo wörld", "second line ünïcode"]
    (tmp_path / "bad16.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CorpusError, match=r"bad16.txt: starts as UTF-16 but is not \("):
        read_bytes(str(tmp_path / "bad16.txt"))


def test_csv_rows_that_do_not_fit_the_header_and_texts_that_are_not_strings_are_rejected_by_line():
    res = parse_file(b"id,text\n1,ok row\n2,too,many,fields\n3\n4,another ok\n", "csv", "f.csv", cfg())
    assert res.texts == ["ok row", "another ok"] and res.lines == [2, 5]
    assert res.dropped == {"ragged": 2}
    assert res.errors == ["f.csv:3: 4 field(s) where the header has 2; row rejected", "f.csv:4: 1 field(s) where the header has 2; row rejected"]
    big = "word " * 400_000  # 2 MB in one field: over the csv module's default limit of 131,072 characters
    assert parse_file(f'text\n"{big}"\n'.encode(), "csv", "f", cfg()).texts == [big.strip()]
    res = parse_file(b'{"text": 42}\n{"text": null}\n{"text": ["a"]}\n{"text": "fine"}\n', "jsonl", "g", cfg())
    assert res.texts == ["fine"] and res.dropped == {"not_text": 2, "empty": 1}
    assert res.errors == ["g:1: 'text' is not a string (a JSON or Arrow int); row rejected", "g:3: 'text' is not a string (a JSON or Arrow list); row rejected"]


def test_a_quote_never_closed_is_an_error_not_the_rest_of_the_file_in_one_row():
    """One stray opening quote made every later line one row's text, without a word (17 of 20 rows, in an audit)."""
    stray = b'id,text\n1,one\n2,"broken quote starts here\n3,three\n4,four\n'
    with pytest.raises(CorpusError, match=r'^f.csv:3: a quoted field of this row is never closed, so lines 3-5 \(the rest of the '
                                          r'file\) read as one row; close the quote, or double a quote inside a quoted field \(""\)$'):
        parse_file(stray, "csv", "f.csv", cfg(id_column="id"))
    closed = parse_file(b'id,text\n1,"two\nlines"\n2,"a ""quoted"" word"\n3,"open at the end\n', "csv", "f", cfg(id_column="id"))
    assert closed.texts == ["two\nlines", 'a "quoted" word', "open at the end"]  # the last: nothing after it to swallow


def test_csv_tsv_txt_parquet():
    assert parse_file(b'text,id\n"a, quoted",7\nb,8\n', "csv", "f", cfg(id_column="id")).ids == ["7", "8"]
    assert parse_file(b'text,id\n"a, quoted",7\n', "csv", "f", cfg()).texts == ["a, quoted"]
    assert parse_file(b"id\ttext\n1\thello\n2\tworld\n", "tsv", "f", cfg()).texts == ["hello", "world"]
    assert parse_file(b"l1\n\nl3\r\n", "txt", "f", cfg()).texts == ["l1", "l3"]
    import io

    buf = io.BytesIO()
    pq.write_table(pa.table({"body": ["x", None, "y"]}), buf)
    res = parse_file(buf.getvalue(), "parquet", "f", cfg(text_column="body"))
    assert res.texts == ["x", "y"]
    assert res.dropped == {"empty": 1}


def test_tsv_written_with_quoting():
    data = b'text\tid\n"He said ""hi"" to me."\ta\n"line one\nline two"\tb\nplain\tc\n"tab\tinside"\td\n'  # pandas' to_csv(sep="\t")
    res = parse_file(data, "tsv", "f", cfg(id_column="id"))
    assert res.texts == ['He said "hi" to me.', "line one\nline two", "plain", "tab\tinside"] and res.ids == ["a", "b", "c", "d"]
    assert res.lines == [2, 4, 5, 6] and res.dropped == {"tsv_quoted": 1} and res.errors == []
    res = parse_file(b'text\tid\n"Hello," he said.\ta\n', "tsv", "f", cfg(id_column="id"))  # STS's way: a quote is text
    assert res.texts == ['"Hello," he said.'] and res.dropped == {}


def test_max_chars():
    assert parse_file(b'{"text": "abcdefgh"}\n', "jsonl", "f", cfg(max_chars=4)).texts == ["abcd"]


def test_medi2_strips_instructions():
    line = {"query": ["Represent the query", "q"], "pos": [["Represent the doc", "positive text"]],
            "neg": [["Represent the doc", "negative one"], ["Represent the doc", "negative two"]]}
    res = parse_file((json.dumps(line) + "\n").encode(), "medi2", "f", cfg())
    assert res.texts == ["positive text", "negative one", "negative two"]


def test_medi2_skips_task_files(tmp_path):
    (tmp_path / "task1234_x.jsonl").write_text("{}\n")
    (tmp_path / "msmarco.jsonl").write_text("{}\n")
    files = list_files([str(tmp_path)], "medi2")
    assert [f.rsplit("/", 1)[1] for f, _ in files] == ["msmarco.jsonl"]


def test_ids_and_dedup():
    res = parse_file(b'{"text": "a"}\n{"text": "b"}\n{"text": "a"}\n', "jsonl", "f", cfg())
    t = rows_table(res, "f", dedup=True)
    assert t.column("doc_id").to_pylist() == [text_hash("a"), text_hash("b"), text_hash("a")]
    d, n = dedup_table(t)
    assert n == 1
    assert sorted(d.column("text").to_pylist()) == ["a", "b"]
    assert d.filter(pa.compute.equal(d["text"], "a")).column("line").to_pylist() == [1]  # first occurrence kept
    nd = rows_table(res, "f", dedup=False)
    assert len(set(nd.column("doc_id").to_pylist())) == 3


def test_sample_key_deterministic():
    assert sample_key("abc", 0) == sample_key("abc", 0)
    assert sample_key("abc", 0) != sample_key("abc", 1)
    assert 0 <= sample_key("abc", 0) < 1


def test_list_files_errors(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        list_files([str(tmp_path / "nope.jsonl")], "auto")
    with pytest.raises(CorpusError, match="empty"):
        list_files([], "auto")
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.txt").write_text("")
    assert [f for _, f in list_files([str(tmp_path / "*.jsonl")], "auto")] == ["jsonl"]
    assert [f for _, f in list_files([str(tmp_path)], "auto")] == ["jsonl", "txt"]
    assert list_files([str(tmp_path / "a.jsonl"), str(tmp_path), str(tmp_path / "*.jsonl")], "auto") == [
        (str(tmp_path / "a.jsonl"), "jsonl"), (str(tmp_path / "b.txt"), "txt")]  # a file named twice is read once
    with pytest.raises(CorpusError, match=r"^corpus glob .*/aa\*.jsonl matches no file$"):
        list_files([str(tmp_path / "a.jsonl"), str(tmp_path / "aa*.jsonl")], "auto")


def test_globs_match_as_the_shell_does(tmp_path, caplog):
    """``*`` stays in one folder (it took sub/n.jsonl too: a backup folder's copy was embedded twice), ``**/`` reaches
    below; files named .* or _* are left out, as a folder's are (an embed OUT's _corpus parts were read as corpus)."""
    for name in ("a.jsonl", "b.jsonl", "c.txt", "_meta.jsonl", "sub/n.jsonl", "sub/deeper/m.jsonl", "sub/_corpus/p.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    names = lambda pattern: [u[len(str(tmp_path)) + 1:] for u, _ in list_files([str(tmp_path / pattern)], "auto")]  # noqa: E731
    assert names("*.jsonl") == ["a.jsonl", "b.jsonl"]
    assert names("**/*.jsonl") == ["a.jsonl", "b.jsonl", "sub/deeper/m.jsonl", "sub/n.jsonl"]
    assert names("sub/*/*.jsonl") == ["sub/deeper/m.jsonl"]
    assert names("[ab].jsonl") == names("?.jsonl") == ["a.jsonl", "b.jsonl"]
    assert names("[!a].*") == ["b.jsonl", "c.txt"]
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("corpus: 1 file(s) named .* or _* (or in such a folder) in a folder or glob left out as hidden or "
                              "metadata files (_meta.jsonl)")
    assert "(_meta.jsonl, p.jsonl)" in said[1]


# ------------------------------------------------------------------------------------------- Ray stage


def _prepare(run, c, force=False):
    return run_stage(run, "prepare", c.config_hash(), lambda ctx: prepare(c, ctx), force=force)


def test_prepare_bad_input(ray_local, tmp_path, caplog):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_bytes(b'{"text": "alpha"}\n\n{"text": "alpha"}\n{oops\n{"text": "caf\xe9"}\n')
    with gzip.open(src / "b.txt.gz", "wt") as f:
        f.write("beta\n  \ngamma\n")
    run = RunDir(str(tmp_path / "run"))
    c = CorpusConfig(paths=[str(src)])
    with caplog.at_level("WARNING", logger="cqg_ray"):
        m = _prepare(run, c)
    assert "prepare: 1 row(s) held bytes that are not UTF-8, replaced by U+FFFD" in caplog.text
    assert m["counts"]["documents"] == 4
    assert m["counts"]["duplicates"] == 1
    assert m["counts"]["dropped_bad_json"] == 1
    assert m["counts"]["dropped_empty"] == 2
    assert m["counts"]["replaced_invalid_utf8"] == 1
    stats = run.read_json("prepare/stats.json")
    assert stats["errors"] == [f"{src}/a.jsonl:4: invalid JSON (Expecting property name enclosed in double quotes at column 2)"]
    t = load_corpus(run)
    assert sorted(t.column("text").to_pylist()) == ["alpha", "beta", "caf\ufffd", "gamma"]
    assert t.column("doc_id").to_pylist() == sorted(t.column("doc_id").to_pylist())


def test_more_files_than_tasks_in_flight_are_parsed_and_reported_in_file_order(ray_local, tmp_path):
    """parse_files keeps at most twice the cluster's CPUs of parse tasks in flight: 9 files on this 2-CPU Ray wait
    for each other, and their tallies (errors, rows) come back in the files' order."""
    import ray

    from cqg_ray.corpus.stage import parse_files

    assert ray.cluster_resources()["CPU"] * 2 < 9
    src = tmp_path / "src"
    src.mkdir()
    for i in range(9):
        (src / f"f{i}.jsonl").write_text("".join(json.dumps({"text": f"text {j} of file {i}"}) + "\n" for j in range(i + 1)) + "{oops\n")
    items = [{"uri": str(src / f"f{i}.jsonl"), "format": "jsonl", "index": i} for i in range(9)]
    tallies = parse_files(items, CorpusConfig(paths=[str(src)]).model_dump_json(), str(tmp_path / "parts"))
    assert [t["index"] for t in tallies] == list(range(9)) and [t["rows"] for t in tallies] == list(range(1, 10))
    assert [t["errors"] for t in tallies] == [[f"{src}/f{i}.jsonl:{i + 2}: invalid JSON (Expecting property name enclosed in "
                                               "double quotes at column 2)"] for i in range(9)]
    assert [t["dropped"] for t in tallies] == [{"bad_json": 1}] * 9
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [f"part-{i:06d}.parquet" for i in range(9)]


def test_a_bad_file_stops_every_parse_task_before_the_error_reaches_the_caller(ray_local, tmp_path):
    """The first file is not Parquet: parse_files raises its CorpusError only once the parse tasks still in flight
    have ended, so no part appears after the caller has the error (the next prepare deletes the parts it finds, and a
    task still writing would put an old file's rows into the new corpus)."""
    import time

    from cqg_ray.corpus.stage import parse_files, unwrap_error

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.parquet").write_bytes(b"PAR1 not parquet")
    for i in range(1, 9):
        (src / f"f{i}.jsonl").write_text("".join(json.dumps({"text": f"text {j} of file {i}"}) + "\n" for j in range(100_000)))
    items = [{"uri": str(src / "a.parquet"), "format": "parquet", "index": 0}]
    items += [{"uri": str(src / f"f{i}.jsonl"), "format": "jsonl", "index": i} for i in range(1, 9)]
    parts = tmp_path / "parts"
    with pytest.raises(Exception) as err:
        parse_files(items, CorpusConfig(paths=[str(src)]).model_dump_json(), str(parts))
    assert isinstance(unwrap_error(err.value, CorpusError), CorpusError)
    at_error = sorted(p.name for p in parts.iterdir()) if parts.exists() else []
    time.sleep(3.0)  # a parse of one of these files takes ~1 s here
    assert (sorted(p.name for p in parts.iterdir()) if parts.exists() else []) == at_error
    assert len(at_error) < 8  # the error stopped the files after it


def test_a_failed_prepares_parts_do_not_enter_the_next_corpus(ray_local, tmp_path):
    """A prepare that stops on a bad file leaves the parts of the files it had read; the next prepare of the run, with
    other paths, holds its own files' rows only."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.jsonl").write_text("".join(json.dumps({"text": f"text {j} of file {i}"}) + "\n" for j in range(20)))
    (src / "z.parquet").write_bytes(b"PAR1 not parquet")
    run = RunDir(str(tmp_path / "run"))
    with pytest.raises(CorpusError, match="z.parquet: not a readable Parquet file"):
        _prepare(run, CorpusConfig(paths=[str(src)]))
    assert run.ls("prepare/_parts", suffix=".parquet")  # what the failed run had written
    m = _prepare(run, CorpusConfig(paths=[str(src / "f1.jsonl")]), force=True)
    assert (m["counts"]["documents"], m["counts"]["duplicates"]) == (20, 0)
    assert sorted(load_corpus(run).column("text").to_pylist()) == sorted(f"text {j} of file 1" for j in range(20))


def test_prepare_missing_column_error(ray_local, tmp_path):
    (tmp_path / "a.jsonl").write_text('{"body": "x"}\n')
    run = RunDir(str(tmp_path / "run"))
    with pytest.raises(CorpusError) as err:
        _prepare(run, CorpusConfig(paths=[str(tmp_path / "a.jsonl")]))
    assert str(err.value) == (f"{tmp_path}/a.jsonl: no line has the text field 'text'; first problem: {tmp_path}/a.jsonl:1: "
                              "no field 'text' (fields: body)")  # the message alone, not the Ray task's traceback
    assert run.state("prepare").state == "missing"


def test_prepare_of_empty_files_says_they_hold_no_rows(ray_local, tmp_path):
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.txt").write_text("")
    with pytest.raises(CorpusError) as err:
        _prepare(RunDir(str(tmp_path / "run")), CorpusConfig(paths=[str(tmp_path / "a.jsonl"), str(tmp_path / "b.txt")]))
    assert str(err.value) == "the corpus is empty (no rows in its 2 file(s)); nothing to do"


def test_prepare_sample_is_deterministic_and_rerun_identical(ray_local, tmp_path, corpus_file):
    c = CorpusConfig(paths=[str(corpus_file)], limit=100, rows_per_shard=40)
    r1, r2 = RunDir(str(tmp_path / "r1")), RunDir(str(tmp_path / "r2"))
    m1 = _prepare(r1, c)
    _prepare(r2, c)
    assert m1["counts"]["documents"] == 100
    assert m1["counts"]["read_rows"] == 400
    assert load_corpus(r1).equals(load_corpus(r2))
    assert len(r1.ls("prepare", suffix=".parquet")) == 3
    again = _prepare(r1, c)  # done: skipped, same manifest
    assert again == m1


def test_a_txt_corpus_with_an_id_column_is_one_error(tmp_path):
    """Every line of a .txt file has no id: with corpus.id_column set each was rejected, with 20 warnings, and then
    'the corpus is empty after cleaning'; now one error that says what to do."""
    with pytest.raises(CorpusError) as e:
        parse_file(b"a text\nanother\n", "txt", "mine.txt", CorpusConfig(id_column="id"))
    assert str(e.value) == ("mine.txt: a .txt file holds one text a line and no ids: unset corpus.id_column ('id'), or give "
                            "the ids in a jsonl, csv or parquet file")
    assert parse_file(b"a text\nanother\n", "txt", "mine.txt", CorpusConfig()).texts == ["a text", "another"]


def test_the_corpus_is_checked_before_the_lease_where_prepare_will_run(tmp_path, monkeypatch, capsys):
    """A corpus path not found was said after the lease, the run folder and Ray's start (15-22 s); now at once, with
    where a relative path is read from. A finished prepare is not asked again (its corpus may be gone)."""
    from cqg_ray.cli import check_corpus, main
    from cqg_ray.config import load_config, stage_hash
    from cqg_ray.rundir import RunDir, run_stage

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.yaml").write_text("corpus:\n  paths: [data/nope.jsonl]\n")
    assert main(["run", "--config", "my.yaml", "--until", "prepare"]) == 2
    assert capsys.readouterr().err == (f"error: corpus path not found: data/nope.jsonl (a relative path, read from {tmp_path}, "
                                       "where the command runs)\n")
    assert not (tmp_path / "runs").exists()  # no run folder, no lease
    assert main(["prepare", "--config", "my.yaml", "--set", "corpus.paths=[]"]) == 2
    assert capsys.readouterr().err == "error: corpus.paths is empty: give at least one file or folder\n"
    cfg = load_config("my.yaml")
    run_stage(RunDir(cfg.run_dir), "prepare", stage_hash(cfg, "prepare"), lambda ctx: None, deps=[])  # prepare done
    check_corpus(cfg, ["prepare", "encode"])  # done for this config: its corpus is not read again
    check_corpus(cfg, ["encode", "cluster"])
    with pytest.raises(CorpusError, match="corpus path not found: data/nope.jsonl"):
        check_corpus(cfg, ["prepare"], forced=["prepare"])


def test_a_folder_leaves_out_its_files_of_no_corpus_format_and_says_so(tmp_path, caplog):
    """A corpus folder with a README.md (as a downloaded dataset's has) failed prepare with "cannot tell the format of
    .../README.md"; its corpus files are now read and the others left out, in one warning. A file named on its own
    still has to be a corpus format."""
    import logging

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "data" / "README.md").write_text("# a dataset\n")
    (tmp_path / "data" / "LICENSE").write_text("MIT\n")
    with caplog.at_level(logging.WARNING, logger="cqg_ray"):
        assert list_files([str(tmp_path / "data")], "auto") == [(str(tmp_path / "data" / "a.jsonl"), "jsonl")]
    assert [r.getMessage() for r in caplog.records] == [
        "corpus: 2 file(s) of no corpus format left out (LICENSE, README.md): name them .jsonl/.parquet/.csv/.tsv/.txt to read "
        "them, or set corpus.format"]
    (tmp_path / "data" / "a.jsonl").unlink()
    with pytest.raises(CorpusError, match=r"^no corpus files found under .*data \(2 file\(s\) of no corpus format: LICENSE, README.md\)$"):
        list_files([str(tmp_path / "data")], "auto")
    with pytest.raises(CorpusError, match="cannot tell the format"):
        list_files([str(tmp_path / "data" / "README.md")], "auto")


def test_a_folders_hidden_and_underscore_files_of_a_corpus_format_are_left_out_and_said(tmp_path, caplog):
    """_train.jsonl in a corpus folder was left out without a word (files named .* or _* are hidden or metadata files,
    as _SUCCESS); named as a path of its own, it is read."""
    import logging

    (tmp_path / "data").mkdir()
    for name in ("a.jsonl", "_train.jsonl", ".cache.jsonl", "_SUCCESS"):
        (tmp_path / "data" / name).write_text('{"text": "x"}\n')
    with caplog.at_level(logging.WARNING, logger="cqg_ray"):
        assert list_files([str(tmp_path / "data")], "auto") == [(str(tmp_path / "data" / "a.jsonl"), "jsonl")]
    assert [r.getMessage() for r in caplog.records] == [
        "corpus: 2 file(s) named .* or _* (or in such a folder) in a folder or glob left out as hidden or metadata files (.cache.jsonl, _train.jsonl): rename "
        "them, or name them as paths, to read them"]
    assert list_files([str(tmp_path / "data" / "_train.jsonl")], "auto") == [(str(tmp_path / "data" / "_train.jsonl"), "jsonl")]

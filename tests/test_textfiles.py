"""Reading files of texts: TSVs written plainly (STS's) or with CSV quoting (pandas', the csv module's)."""

import csv
import io
import os

import pytest

from cqg_ray.textfiles import plain_name, read_tsv_rows, tsv_quoted

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
ROWS = [["text", "id"], ['He said "hi" to me.', "a"], ["line one\nline two", "b"], ["plain text", "c"], ["tab\tinside", "d"]]


def written(rows: list[list[str]]) -> str:
    """Rows as pandas' to_csv(sep="\\t", index=False) writes them (the csv module's minimal quoting)."""
    buf = io.StringIO()
    csv.writer(buf, delimiter="\t", lineterminator="\n").writerows(rows)
    return buf.getvalue()


def test_a_tsv_written_with_quoting_is_told_apart():
    assert written(ROWS).startswith('text\tid\n"He said ""hi"" to me."\ta\n"line one\nline two"\tb\n')
    assert tsv_quoted(written(ROWS))
    assert tsv_quoted(written(ROWS[:2]))  # a doubled quote alone
    assert tsv_quoted(written([ROWS[0], ROWS[2]]))  # a newline alone: plainly read, its row breaks in two
    assert tsv_quoted(written([ROWS[0], ROWS[4]]))  # a tab alone


def test_plain_tsvs_stay_plain():
    assert not tsv_quoted(written([ROWS[0], ROWS[3]]))  # no quote at all
    assert not tsv_quoted('sentence1\tsentence2\tscore\n"Hello," he said.\tHe said hello.\t4.2\n"A whole quote."\tA quote.\t5\n')
    assert not tsv_quoted('text\tid\nshe said "no\ta\textra\n')  # a broken row that quoting does not mend
    assert not tsv_quoted("")


@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED, "sts")), reason="../shared/data is not here")
def test_the_sts_files_are_plain():
    for name in ("STS12.test.tsv", "STS13.test.tsv", "STSBenchmark.train.tsv", "STSBenchmark.dev.tsv", "STSBenchmark.test.tsv"):
        with open(os.path.join(SHARED, "sts", name), encoding="utf-8") as f:
            assert not tsv_quoted(f.read()), name


def test_read_tsv_rows(tmp_path):
    quoted = tmp_path / "quoted.tsv"
    quoted.write_text(written(ROWS) + "\n")
    assert read_tsv_rows(str(quoted)) == [(1, ["text", "id"]), (2, ['He said "hi" to me.', "a"]), (4, ["line one\nline two", "b"]),
                                          (5, ["plain text", "c"]), (6, ["tab\tinside", "d"])]
    plain = tmp_path / "plain.tsv"
    plain.write_text('text\tid\n"Hello," he said.\ta\n\n  \nb\tc\td\n')
    assert read_tsv_rows(str(plain)) == [(1, ["text", "id"]), (2, ['"Hello," he said.', "a"]), (5, ["b", "c", "d"])]


def test_plain_name():
    assert plain_name("a/B.TSV.GZ") == plain_name("a/b.tsv.gz") == plain_name("a/b.tsv") == "a/b.tsv"
    assert plain_name("x.gz.jsonl") == "x.gz.jsonl"

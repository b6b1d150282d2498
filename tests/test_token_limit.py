"""The token-limit counts: per unit in a Parquet file's schema metadata, summed from the footers, and the line said."""

from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq

from cqg_ray.token_limit import token_limit_counts, token_limit_note, unit_metadata


def test_units_keep_their_counts_and_the_footers_sum_them(tmp_path):
    enc = SimpleNamespace(texts_counted=10, texts_at_limit=3, max_seq_length=256)
    table = pa.table({"doc_id": ["a", "b", "c", "d"]}).replace_schema_metadata({b"other": b"kept"})
    meta = unit_metadata(enc, (6, 1))  # the encoder's counters were (6, 1) when the unit began: 4 texts, 2 at the limit
    assert meta == {b"cqg_ray.texts_counted": b"4", b"cqg_ray.texts_at_token_limit": b"2", b"cqg_ray.token_limit": b"256"}
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, **meta}), tmp_path / "u1.parquet")
    pq.write_table(pa.table({"doc_id": ["e", "f"]}), tmp_path / "u2.parquet")  # written without counts (an earlier version)
    assert pq.read_schema(tmp_path / "u1.parquet").metadata[b"other"] == b"kept"
    footers = {n: pq.ParquetFile(tmp_path / n).metadata for n in ("u1.parquet", "u2.parquet")}
    assert token_limit_counts([footers["u1.parquet"], footers["u2.parquet"]]) == {
        "texts_counted": 4, "texts_at_token_limit": 2, "token_limit": 256, "texts_not_counted": 2}
    assert token_limit_counts([footers["u2.parquet"]]) == {
        "texts_counted": 0, "texts_at_token_limit": 0, "token_limit": None, "texts_not_counted": 2}


def test_the_line_says_how_many_texts_were_read_in_part():
    counts = {"texts_counted": 20000, "texts_at_token_limit": 1234, "token_limit": 256}
    assert token_limit_note("embed", counts) == (
        "embed: 1,234 of 20,000 texts (6.2%) filled the encoder's 256 tokens: words past the 256th token are not read "
        "(split long documents into passages to embed all of their words)")
    assert token_limit_note("encode", {**counts, "texts_at_token_limit": 0}) == "encode: every text fit the encoder's 256 tokens"
    assert token_limit_note("encode", {"texts_counted": 0, "texts_at_token_limit": 0, "token_limit": None}) is None
    assert token_limit_note("embed", {**counts, "texts_not_counted": 50}) == (
        "embed: 1,234 of 20,000 texts (6.2%) filled the encoder's 256 tokens (50 other texts not counted): words past the "
        "256th token are not read (split long documents into passages to embed all of their words)")
    assert token_limit_note("embed", {**counts, "texts_at_token_limit": 0, "texts_not_counted": 50}) == (
        "embed: every counted text fit the encoder's 256 tokens (50 other texts not counted)")

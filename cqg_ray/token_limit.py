"""How many texts the encoder read only in part: those whose tokens filled its max_seq_length (the words past it are not
read). The actor's encoder counts them (`Encoder.texts_counted`, `texts_at_limit`), each unit file keeps its unit's
counts in its Parquet schema metadata, and the encode stage and `cqg-ray embed` sum them from the footers into their
manifests and one log line."""

from __future__ import annotations

COUNTED_KEY, AT_LIMIT_KEY, LIMIT_KEY = b"cqg_ray.texts_counted", b"cqg_ray.texts_at_token_limit", b"cqg_ray.token_limit"


def unit_metadata(encoder, before: tuple[int, int]) -> dict[bytes, bytes]:
    """A unit's counts: the encoder's counters now less ``before`` (texts counted, texts at the limit), and the limit."""
    return {COUNTED_KEY: str(encoder.texts_counted - before[0]).encode(), AT_LIMIT_KEY: str(encoder.texts_at_limit - before[1]).encode(),
            LIMIT_KEY: str(encoder.max_seq_length).encode()}


def token_limit_counts(footers) -> dict:
    """The unit files' counts summed from their footers (``pq.FileMetaData``, as the stage read them for their rows):
    texts counted, texts that filled the limit, the limit, and the rows of units written without counts (by an earlier
    version, or by the library's own encode loop)."""
    counted = at_limit = uncounted = 0
    limits = set()
    for meta in footers:
        kv = meta.metadata or {}
        n = int(kv.get(COUNTED_KEY, b"0"))
        counted, at_limit, uncounted = counted + n, at_limit + int(kv.get(AT_LIMIT_KEY, b"0")), uncounted + meta.num_rows - n
        if LIMIT_KEY in kv:
            limits.add(int(kv[LIMIT_KEY]))
    return {"texts_counted": counted, "texts_at_token_limit": at_limit, "token_limit": max(limits) if limits else None,
            "texts_not_counted": uncounted}


def token_limit_note(what: str, counts: dict) -> str | None:
    """The line that says how many texts the encoder read only in part; None where it counted none."""
    n, at, limit = counts["texts_counted"], counts["texts_at_token_limit"], counts["token_limit"]
    if not n:
        return None
    others = f" ({counts['texts_not_counted']:,} other texts not counted)" if counts.get("texts_not_counted") else ""
    if not at:
        return f"{what}: {'every' if not others else 'every counted'} text fit the encoder's {limit} tokens{others}"
    return (f"{what}: {at:,} of {n:,} texts ({at / n:.1%}) filled the encoder's {limit} tokens{others}: words past the {limit}th "
            "token are not read (split long documents into passages to embed all of their words)")

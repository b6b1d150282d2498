"""What every entry point checks of the texts it is given, before any encoder or tokenizer sees them: a list of str,
valid Unicode, and whether a text holds anything to read."""

from __future__ import annotations

import unicodedata


def unicode_error(text: str, name: str) -> str | None:
    """Why ``text`` (called ``name`` in the message) is not valid Unicode, or None when it is: a str may hold an unpaired
    surrogate (JSON's "\\ud800" escape gives one), which has no UTF-8 form, so no tokenizer or Arrow string takes it."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"{name} is not valid Unicode (an unpaired surrogate at character {e.start})"
    return None


def text_list(texts) -> list[str]:
    """``encode``'s texts as a list: any ordered sequence or iterable of str (a list, tuple, numpy array, pandas Series,
    generator); TypeError for one text, bytes, a set or a dict (no order), or an item that is not a str."""
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"encode takes a list of texts, got one {type(texts).__name__}; wrap a single text in a list")
    if isinstance(texts, (set, frozenset, dict)):
        raise TypeError(f"encode takes an ordered sequence of texts (a list), got a {type(texts).__name__}: its rows would follow no order")
    texts = list(texts)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        missing = " (a missing value: NaN or None)" if texts[bad] is None or (isinstance(texts[bad], float) and texts[bad] != texts[bad]) else ""
        raise TypeError(f"texts[{bad}] must be a str, got {type(texts[bad]).__name__}{missing}")
    return texts


BLANK = "empty, or only whitespace and characters no encoder reads"  # what `blank` means, for messages


def blank(text: str) -> bool:
    """Whether a text holds nothing to read: empty, or only whitespace, control and format characters (NUL, zero-width
    spaces and joiners, a BOM, soft hyphens: what a tokenizer drops) and U+FFFD, the mark of undecodable bytes. Such a
    text answers no to every question. Stops at the first other character: a normal text costs a character or two."""
    return all(c.isspace() or c == "\ufffd" or unicodedata.category(c) in ("Cc", "Cf") for c in text)


def clipped(text: str, n: int) -> str:
    """``text`` as a line shows it: each run of whitespace (newlines, tabs) one space, at most n characters, a longer
    one cut with "..." and the text's length."""
    line = " ".join(text.split())
    return line if len(line) <= n else f"{line[: n - 3]}... ({len(text):,} characters)"

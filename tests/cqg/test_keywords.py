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

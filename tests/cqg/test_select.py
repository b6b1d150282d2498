import numpy as np

from cqg_ray.cqg.select import dedup, own_cluster_no, priority_order, quality, quality_medians, text_filters, top_t


def dedup_reference(emb: np.ndarray, order: np.ndarray, theta: float) -> np.ndarray:
    """The plain sequential O(m^2) definition of the theta dedup: keep a question unless it is too close to a kept one."""
    x = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    kept: list[int] = []
    for i in order:
        if all(float(x[i] @ x[j]) <= theta for j in kept):
            kept.append(int(i))
    return np.array(kept, dtype=np.int64)


def test_quality_equation_1_by_hand():
    # 5 positive probes, 3 hard + 2 easy negatives
    q = quality(pos_yes=np.array([5, 4, 0, 3]), pos_n=np.array([5, 5, 5, 5]), neg_yes=np.array([0, 1, 5, 5]), neg_n=np.array([5, 5, 5, 5]))
    assert np.allclose(q, [1.0, 0.8 - 0.2, -1.0, 0.6 - 1.0])


def test_quality_with_failed_probes():
    q = quality(np.array([2, 1]), np.array([4, 0]), np.array([1, 0]), np.array([5, 5]))
    assert np.isclose(q[0], 0.5 - 0.2)
    assert np.isnan(q[1])


def test_top_t():
    clusters = np.array([0, 0, 0, 1, 1, 2])
    q = np.array([0.1, 0.9, 0.5, np.nan, 0.2, -0.3])
    assert top_t(clusters, q, 2).tolist() == [1, 2, 4, 5]
    assert top_t(clusters, q, 1).tolist() == [1, 4, 5]
    # ties: the earlier question wins
    assert top_t(np.array([0, 0, 0]), np.array([0.5, 0.5, 0.5]), 2).tolist() == [0, 1]


def test_dedup_hand_case():
    emb = np.array([[1, 0, 0], [0.95, 0.312, 0], [0, 1, 0], [0, 0, 1], [0.7, 0.7, 0]], dtype=np.float32)
    q = np.array([0.9, 0.8, 0.7, 0.6, 1.0])
    order = priority_order(q, np.arange(5))
    assert order.tolist() == [4, 0, 1, 2, 3]
    kept, dup = dedup(emb, order, 0.8)
    # 4 kept first; 0: cos 0.707 with 4 -> kept; 1: cos 0.89 with 4 and 0.95 with 0 -> dropped (first kept
    # neighbour in priority order is 4); 2: cos 0.707 with 4, 0.31 with 1 -> kept; 3 is orthogonal -> kept
    assert kept.tolist() == [4, 0, 2, 3]
    assert dup.tolist() == [-1, 4, -1, -1, -1]


def test_dedup_matches_sequential_definition():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(40, 16))
    emb = np.concatenate([base, base[:30] + rng.normal(scale=0.3, size=(30, 16))]).astype(np.float32)
    order = rng.permutation(len(emb))
    for theta in (0.5, 0.8, 0.95):
        kept, _ = dedup(emb, order, theta)
        assert kept.tolist() == dedup_reference(emb, order, theta).tolist()


def test_text_filters_name_the_first_reason_and_never_rewrite():
    qs = ["Does the text quote a film title?",                      # copied (the flag says so)
          "Is the text about " + "one two three four five " * 5 + "?",  # 29 words
          "Is the article about the?",                               # cut off: ends on a function word
          "Does the text discuss the weather?",                      # the last item of a reply stopped on the limit
          "Does the text describe an everyday scene?",               # kept
          "Is the text about a movie?"]                              # kept
    copied = np.array([True, False, False, False, False, False])
    stopped_last = np.array([False, False, False, True, False, False])
    all_filters = ["copy", "long", "cut_off", "own_cluster"]
    assert text_filters(qs, all_filters, 25, copied, stopped_last) == ["copy", "long", "cut_off", "cut_off", "", ""]
    assert text_filters(qs, [], 25, copied, stopped_last) == [""] * 6
    assert text_filters(qs, ["long"], 30, copied, stopped_last) == [""] * 6  # 29 words <= 30
    assert text_filters(["Is it " + "x " * 24 + "?"], ["long"], 25, [False], [False]) == ["long"]  # 26 words > 25
    assert text_filters(["Is it " + "x " * 23 + "?"], ["long"], 25, [False], [False]) == [""]  # 25 words


def test_own_cluster_no_drops_questions_answered_yes_for_at_most_half():
    pos_yes = np.array([10, 6, 5, 0, 0])
    pos_n = np.array([10, 10, 10, 10, 0])
    assert own_cluster_no(pos_yes, pos_n).tolist() == [False, False, True, True, False]  # unprobed: not judged here


def test_own_cluster_for_sentences_takes_a_lower_bar_and_an_eq1_floor():
    """A sentence cluster's property holds for fewer of its texts: a bar of 1/6 keeps a question said yes for 2 of 6
    positives (1 of 6 is at the bar: dropped), and the Eq. 1 floor drops one as often yes outside its cluster as in it."""
    pos_yes, pos_n = np.array([2, 1, 2, 6, 0]), np.array([6, 6, 6, 6, 0])
    q = np.array([0.3333, 0.1667, 0.0, 0.5, np.nan])  # the third: 2 of 6 positives, and as many negatives, say yes
    assert own_cluster_no(pos_yes, pos_n, share=1 / 6).tolist() == [False, True, False, False, False]
    assert own_cluster_no(pos_yes, pos_n, 1 / 6, q, min_quality=0.0).tolist() == [False, True, True, False, False]
    assert own_cluster_no(pos_yes, pos_n, 0.0, q, 0.0).tolist() == [False, False, True, False, False]


def test_quality_medians_of_kept_and_not_kept():
    q = np.array([0.9, 0.7, 0.1, -0.2, np.nan, 0.3])
    kept = np.array([True, True, False, False, False, False])
    assert quality_medians(q, kept) == {"quality_median_kept": 0.8, "quality_median_dropped": 0.1}
    assert quality_medians(np.array([np.nan]), np.array([False])) == {"quality_median_kept": None, "quality_median_dropped": None}


def test_the_example_filter_drops_echoes_of_the_worked_examples():
    from cqg_ray.cqg.stage import example_questions
    from cqg_ray.config import CQGConfig

    examples = example_questions(CQGConfig())
    assert "Is a dog or other pet shown?" in examples and len(examples) == 12
    assert example_questions(CQGConfig(prompt="paper")) == [] and len(example_questions(CQGConfig(examples=1))) == 4
    qs = ["Is a phone or other electronic device discussed in the review?",  # a run of 7 example words
          "Is a disease or a symptom mentioned?",                            # an example question word for word
          "is a disease or a  symptom mentioned",                            # the same words
          "Does the writer complain about battery drain?",                   # "does the writer complain about battery": 6 words
          "Does the text report a central bank action?"]                     # its own question
    none = np.zeros(len(qs), bool)
    assert text_filters(qs, ["example"], 25, none, none, examples) == ["example", "example", "example", "example", ""]
    assert text_filters(qs, ["copy", "long"], 25, none, none, examples) == [""] * 5  # the filter is off
    assert text_filters(qs, ["example"], 25, none, none, []) == [""] * 5  # no examples shown


def test_select_caps_an_opening_and_lets_the_clusters_next_best_take_its_place():
    from cqg_ray.cqg.quality import opening
    from cqg_ray.cqg.select import select

    texts = ["Is the text about dogs?", "Is the text about cats?", "Is the text about cars?", "Is the text about ships?",
             "Does a dog run?", "Are cars being repaired?", "Does a ship sail?", "Is a cat asleep?"]
    clusters = np.array([0, 1, 2, 3, 0, 2, 3, 1])
    q = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    emb = np.eye(8, dtype=np.float32)  # no two alike: dedup keeps everything
    openings = [opening(x) for x in texts]
    chosen, kept, dup_of, capped = select(clusters, q, emb, 1, 0.8, openings, 1.0)  # no cap: the paper's selection
    assert kept.tolist() == [0, 1, 2, 3] and not capped.any() and chosen.tolist() == [0, 1, 2, 3]
    chosen, kept, dup_of, capped = select(clusters, q, emb, 1, 0.8, openings, 0.25)
    # 4 kept all open with "is the text about": the cap (1 of 4) keeps the best, the other clusters' next best come in
    assert capped.tolist() == [False, True, True, True, False, False, False, False]
    assert kept.tolist() == [0, 5, 6, 7] and sorted(chosen.tolist()) == [0, 5, 6, 7]
    assert max(sum(openings[i] == o for i in kept) for o in set(openings)) == 1


def test_select_keeps_one_question_of_an_opening_however_small_the_share():
    from cqg_ray.cqg.select import select

    emb = np.eye(3, dtype=np.float32)
    chosen, kept, _, capped = select(np.array([0, 1, 2]), np.array([0.3, 0.2, 0.1]), emb, 1, 0.8, ["a b c d"] * 3, 0.25)
    assert kept.tolist() == [0] and capped.tolist() == [False, True, True]

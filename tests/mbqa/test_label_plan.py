import numpy as np
import pytest

from cqg_ray.config import LabelConfig
from cqg_ray.mbqa.label_plan import (
    SOURCE_CLUSTER,
    SOURCE_NEIGHBOR,
    SOURCE_RANDOM,
    _split_evenly,
    holdout_docs,
    make_label_plan,
    pack_prompts,
)

# 8 clusters of sizes 60, 50, 40, 3 (small), 45, 0 (empty), 70, 32 -> 300 texts, shuffled
SIZES = [60, 50, 40, 3, 45, 0, 70, 32]
NEIGHBORS = np.array([
    [0, 1, 2, 3, 4],  # the cluster itself is listed first: it must be skipped
    [0, 2, 6, -1, -1],  # -1 = no neighbour
    [1, 0, 4, 6, 7],
    [2, 1, 0, 4, 6],
    [2, 7, 6, 1, 0],
    [0, 1, 2, 3, 4],
    [7, 4, 2, 1, 0],
    [6, 4, 2, 1, 0],
])
CFG = LabelConfig(n_cluster=20, n_neighbor=12, n_random=8, neighbor_clusters=3, questions_per_prompt=5, seed=3)


def corpus(seed=0):
    assignments = np.repeat(np.arange(len(SIZES)), SIZES)
    return np.random.default_rng(seed).permutation(assignments)


def question_clusters():
    # cluster 0 has 4 questions, the small cluster 3 has 2, one question has no cluster
    return np.array([0, 0, 0, 0, 1, 2, 2, 3, 3, 4, 6, 6, 7, -1])


def allowed_neighbors(c):
    return [j for j in NEIGHBORS[c] if j >= 0 and j != c][: CFG.neighbor_clusters]


def test_every_question_gets_its_quota_from_the_right_sources_without_duplicates():
    assignments, qc = corpus(), question_clusters()
    plan = make_label_plan(assignments, NEIGHBORS, qc, CFG)
    total = CFG.n_cluster + CFG.n_neighbor + CFG.n_random
    for q, c in enumerate(qc):
        sel = plan.pair_question == q
        docs, src = plan.pair_doc[sel], plan.pair_source[sel]
        assert len(docs) == total
        assert len(np.unique(docs)) == total
        own, neigh, rand = docs[src == SOURCE_CLUSTER], docs[src == SOURCE_NEIGHBOR], docs[src == SOURCE_RANDOM]
        if c < 0:
            assert len(own) == 0 and len(neigh) == 0 and len(rand) == total
            continue
        assert len(own) == min(CFG.n_cluster, SIZES[c])
        assert (assignments[own] == c).all()
        assert set(assignments[neigh]) <= set(allowed_neighbors(c))
        # shortfall of the own cluster moves to the neighbours, theirs to random
        pool = sum(SIZES[j] for j in allowed_neighbors(c))
        want_neigh = CFG.n_neighbor + CFG.n_cluster - len(own)
        assert len(neigh) == min(want_neigh, pool)
        assert len(rand) == total - len(own) - len(neigh)


def test_small_cluster_spills_to_neighbours():
    plan = make_label_plan(corpus(), NEIGHBORS, np.array([3]), CFG)
    src = plan.pair_source
    # cluster 3 has 3 texts: 3 own, 12 + 17 = 29 from neighbours 2, 1, 0 (40 + 50 + 60 texts), 8 random
    assert [(src == s).sum() for s in (SOURCE_CLUSTER, SOURCE_NEIGHBOR, SOURCE_RANDOM)] == [3, 29, 8]


def test_neighbour_quota_is_split_evenly_nearest_first():
    assignments = corpus()
    plan = make_label_plan(assignments, NEIGHBORS, np.array([4]), CFG)
    neigh = plan.pair_doc[plan.pair_source == SOURCE_NEIGHBOR]
    counts = [int((assignments[neigh] == j).sum()) for j in (2, 7, 6)]
    assert counts == [4, 4, 4]


def test_split_evenly():
    assert _split_evenly(10, np.array([2, 10, 10])).tolist() == [2, 4, 4]
    assert _split_evenly(7, np.array([5, 5, 5])).tolist() == [3, 2, 2]
    assert _split_evenly(100, np.array([5, 0, 3])).tolist() == [5, 0, 3]
    assert _split_evenly(0, np.array([5, 5])).tolist() == [0, 0]


def test_packing_asks_every_planned_pair_exactly_once_and_at_most_qpp_per_prompt():
    plan = make_label_plan(corpus(), NEIGHBORS, question_clusters(), CFG)
    sizes = np.diff(plan.prompt_offsets)
    assert sizes.max() <= CFG.questions_per_prompt and sizes.min() >= 1
    asked = list(zip(np.repeat(plan.prompt_doc, sizes).tolist(), plan.prompt_questions.tolist()))
    planned = list(zip(plan.pair_doc.tolist(), plan.pair_question.tolist()))
    assert len(asked) == len(set(asked)) == len(planned)
    assert set(asked) == set(planned)
    # a text gets a second prompt only when its first one is full
    for doc in np.unique(plan.prompt_doc):
        s = sorted(sizes[plan.prompt_doc == doc], reverse=True)
        assert all(x == CFG.questions_per_prompt for x in s[:-1])
    table = plan.prompts_table()
    assert table.column_names == ["prompt_id", "doc_index", "question_index"]
    assert table.num_rows == plan.n_prompts
    assert table.column("question_index")[0].as_py() == plan.questions_of(0).tolist()


def test_questions_of_one_cluster_share_texts_so_prompts_pack():
    plan = make_label_plan(corpus(), NEIGHBORS, question_clusters(), CFG)
    # the 4 questions of cluster 0 ask about the same 20 own-cluster texts
    own = [set(plan.pair_doc[(plan.pair_question == q) & (plan.pair_source == SOURCE_CLUSTER)].tolist()) for q in range(4)]
    assert own[0] == own[1] == own[2] == own[3]
    counts = plan.counts()
    assert counts["pairs"] == 14 * 40 and counts["prompts"] == plan.n_prompts
    assert counts["pairs_per_prompt"] > 2.8  # 3.06 here; independent draws of the same sizes pack to ~2.2


def test_plan_is_deterministic_by_seed():
    a = make_label_plan(corpus(), NEIGHBORS, question_clusters(), CFG)
    b = make_label_plan(corpus(), NEIGHBORS, question_clusters(), CFG)
    c = make_label_plan(corpus(), NEIGHBORS, question_clusters(), CFG.model_copy(update={"seed": 4}))
    for name in ("pair_question", "pair_doc", "pair_source", "prompt_doc", "prompt_offsets", "prompt_questions"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.pair_doc, c.pair_doc)


def test_tiny_corpus_gives_every_question_all_texts():
    assignments = np.array([0, 0, 1, 1, 1, 2])
    neighbors = np.array([[1, 2], [0, 2], [1, 0]])
    plan = make_label_plan(assignments, neighbors, np.array([0, 2]), CFG)
    for q in (0, 1):
        assert sorted(plan.pair_doc[plan.pair_question == q].tolist()) == [0, 1, 2, 3, 4, 5]


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="question_clusters"):
        make_label_plan(corpus(), NEIGHBORS, np.array([8]), CFG)
    with pytest.raises(ValueError, match="neighbors"):
        make_label_plan(corpus(), NEIGHBORS[:3], np.array([0]), CFG)


def test_pack_prompts_by_hand():
    doc, offsets, questions = pack_prompts(np.array([5, 5, 5, 2]), np.array([3, 1, 2, 0]), 2)
    assert doc.tolist() == [2, 5, 5]
    assert offsets.tolist() == [0, 1, 3, 4]
    assert questions.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="duplicate"):
        pack_prompts(np.array([1, 1]), np.array([0, 0]), 2)


def test_holdout_is_by_document():
    docs = np.repeat(np.arange(100), 3)
    held = holdout_docs(docs, 0.1, seed=0)
    assert len(held) == 10 and len(np.unique(held)) == 10
    assert np.array_equal(held, holdout_docs(docs[::-1], 0.1, seed=0))
    assert not np.array_equal(held, holdout_docs(docs, 0.1, seed=1))
    assert len(holdout_docs(np.array([7, 8]), 0.1)) == 1  # at least one held out, one kept
    assert len(holdout_docs(docs, 0.0)) == 0


def test_random_texts_come_from_the_labelled_pool_and_serve_more_questions():
    assignments, qc = corpus(), question_clusters()
    labelled = make_label_plan(assignments, NEIGHBORS, qc, CFG)
    whole = make_label_plan(assignments, NEIGHBORS, qc, CFG.model_copy(update={"random_from": "corpus"}))
    own_or_neighbor = set(labelled.pair_doc[labelled.pair_source != SOURCE_RANDOM].tolist())
    assert set(labelled.pair_doc[labelled.pair_source == SOURCE_RANDOM].tolist()) <= own_or_neighbor
    # the same pairs per question and per source, on fewer distinct texts
    for p in (labelled, whole):
        assert np.bincount(p.pair_question).tolist() == [CFG.n_cluster + CFG.n_neighbor + CFG.n_random] * len(qc)
    assert (np.bincount(labelled.pair_source) == np.bincount(whole.pair_source)).all()
    assert len(np.unique(labelled.pair_doc)) < len(np.unique(whole.pair_doc))
    assert labelled.n_pairs / len(np.unique(labelled.pair_doc)) > whole.n_pairs / len(np.unique(whole.pair_doc))

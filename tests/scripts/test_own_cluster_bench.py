"""bench/own_cluster.py's rule table on synthetic probe counts (no run, no LLM)."""


import numpy as np
from tests.scripts import load_script

own = load_script("bench/own_cluster.py", "bench_own_cluster")


def test_each_rule_keeps_what_its_bar_and_floor_allow():
    # cluster 0: 4 of 6 positives yes (kept by every rule), 2 of 6 with Eq. 1 0.2, 1 of 6 with Eq. 1 -0.1;
    # cluster 1: 2 of 6 with Eq. 1 0 (not above the floor), a copy (dropped by a text filter whatever its probes), unprobed
    cand = {"cluster": np.array([0, 0, 0, 1, 1, 1]), "quality": np.array([0.5, 0.2, -0.1, 0.0, 0.9, np.nan]),
            "positive_yes": np.array([4, 2, 1, 2, 6, 0]), "positive_n": np.array([6, 6, 6, 6, 6, 0]),
            "filtered": np.array(["", "own_cluster", "own_cluster", "own_cluster", "copy", ""])}
    rows = {(r["share"], r["floor"]): r for r in own.keeps(cand, own.RULES, t=1, prompts=2)}
    assert [rows[(0.5, None)][k] for k in ("kept", "per_prompt", "clusters_without", "top_t")] == [1, 0.5, 1, 1]
    assert rows[(1 / 3, None)]["kept"] == 1  # 2 of 6 is at a third, not above it
    assert rows[(1 / 6, None)]["kept"] == 3 and rows[(1 / 6, None)]["top_t"] == 2  # 1 of 6 is at the bar, not above it
    assert rows[(1 / 6, 0.0)]["kept"] == 2 and rows[(1 / 6, 0.0)]["quality_median"] == 0.35 and rows[(1 / 6, 0.0)]["clusters_without"] == 1
    assert rows[(0.0, 0.0)]["kept"] == 2  # the negative-quality and the zero-quality ones go


def test_the_whole_selection_counts_what_dedup_and_the_opening_filter_drop():
    """With the candidates' embeddings the table runs the stage's selection: two questions of one cluster that are the
    same question (cosine 1) leave one after dedup; an opening held by more than the share loses its worst."""
    cand = {"cluster": np.array([0, 0, 1, 2]), "quality": np.array([0.9, 0.8, 0.7, 0.6]),
            "positive_yes": np.array([6, 6, 6, 6]), "positive_n": np.array([6, 6, 6, 6]), "filtered": np.array(["", "", "", ""]),
            "text": np.array(["Is it about a film?", "Is it about a movie?", "Does the text mention a city?", "Is it about a sport?"])}
    emb = np.array([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    row = own.keeps(cand, [(0.5, None)], t=2, prompts=3, emb=emb, theta=0.8)[0]
    assert (row["chosen"], row["deduped"], row["opening"], row["questions"]) == (4, 1, 0, 3)
    # "Is it about a" opens 2 of the 3 kept: a share of 0.5 allows one, so the sport question (the worse) goes
    row = own.keeps(cand, [(0.5, None)], t=2, prompts=3, emb=emb, theta=0.8, max_opening_share=0.5)[0]
    assert (row["deduped"], row["opening"], row["questions"]) == (1, 1, 2)

import numpy as np

from cqg_ray.artifacts import ClusterIndex
from cqg_ray.cqg.sampling import contrastive_sample, generation_samples, probe_samples, qaemb_articles

# 6 clusters of sizes 10, 10, 10, 10, 3, 40 ; neighbours: 0 -> 1, 2, 3 ...
LABELS = np.repeat(np.arange(6), [10, 10, 10, 10, 3, 40])
NEIGHBORS = np.array([[1, 2, 3, 4, 5], [0, 2, 3, 4, 5], [1, 0, 3, 4, 5], [2, 1, 0, 4, 5], [5, 0, 1, 2, 3], [4, 0, 1, 2, 3]])


def test_disjoint_and_from_the_right_clusters():
    idx = ClusterIndex.build(LABELS)
    s = contrastive_sample(idx, NEIGHBORS, 0, 6, 18, 18, 3, seed=0)
    assert len(s.positives) == 6 and len(s.hard) == 18 and len(s.easy) == 18
    assert set(LABELS[s.positives]) == {0}
    assert set(LABELS[s.hard]) <= {1, 2, 3}
    assert set(LABELS[s.easy]) <= {4, 5}
    allidx = np.concatenate([s.positives, s.hard, s.easy])
    assert len(set(allidx.tolist())) == len(allidx)


def test_small_clusters_take_everything():
    idx = ClusterIndex.build(LABELS)
    s = contrastive_sample(idx, NEIGHBORS, 4, 6, 18, 18, 3, seed=0)
    assert sorted(s.positives.tolist()) == [40, 41, 42]  # cluster 4 has only 3 documents
    assert set(LABELS[s.hard]) <= {5, 0, 1} and len(s.hard) == 18
    # hard pool smaller than n_h: all of it, no top-up
    s2 = contrastive_sample(idx, NEIGHBORS, 0, 6, 100, 18, 1, seed=0)
    assert sorted(s2.hard.tolist()) == list(range(10, 20))
    # easy pool smaller than n_e: all of it
    s3 = contrastive_sample(idx, NEIGHBORS, 0, 6, 5, 100, 3, seed=0)
    assert sorted(s3.easy.tolist()) == list(range(40, 83))


def test_seeded_and_order_independent():
    idx = ClusterIndex.build(LABELS)
    a = generation_samples(idx, NEIGHBORS, [0, 1, 2], 6, 18, 18, 3, seed=5)
    b = generation_samples(idx, NEIGHBORS, [2, 0], 6, 18, 18, 3, seed=5)
    assert a[0].positives.tolist() == b[1].positives.tolist()
    assert a[2].easy.tolist() == b[0].easy.tolist()
    c = generation_samples(idx, NEIGHBORS, [0], 6, 18, 18, 3, seed=6)
    assert a[0].hard.tolist() != c[0].hard.tolist()


def test_neighbour_use():
    idx = ClusterIndex.build(LABELS)
    s = contrastive_sample(idx, NEIGHBORS, 3, 2, 30, 0, 3, seed=0)
    assert set(LABELS[s.hard]) == {2, 1, 0}  # its 3 nearest clusters, all used since the pool has exactly 30


def test_probes_avoid_generation_texts():
    idx = ClusterIndex.build(LABELS)
    gen = generation_samples(idx, NEIGHBORS, [5], 6, 5, 5, 3, seed=0)
    pr = probe_samples(idx, NEIGHBORS, gen, 5, 3, 2, 3, seed=0)[0]
    used = set(np.concatenate([gen[0].positives, gen[0].hard, gen[0].easy]).tolist())
    assert len(pr.positives) == 5 and len(pr.hard) == 3 and len(pr.easy) == 2
    assert not (set(pr.positives.tolist()) | set(pr.hard.tolist()) | set(pr.easy.tolist())) & used
    assert set(LABELS[pr.positives]) == {5}
    # cluster 4 (3 docs) cannot avoid: probes reuse its documents
    gen4 = generation_samples(idx, NEIGHBORS, [4], 6, 5, 5, 3, seed=0)
    pr4 = probe_samples(idx, NEIGHBORS, gen4, 5, 3, 2, 3, seed=0)[0]
    assert sorted(pr4.positives.tolist()) == [40, 41, 42]


def test_several_prompts_per_cluster_show_other_positives_and_share_one_probe_sample():
    idx = ClusterIndex.build(LABELS)
    one = generation_samples(idx, NEIGHBORS, [5, 0], 6, 5, 5, 3, seed=0)
    three = generation_samples(idx, NEIGHBORS, [5, 0], 6, 5, 5, 3, seed=0, prompts=3)
    assert [s.cluster for s in three] == [5, 5, 5, 0, 0, 0]
    assert three[0].positives.tolist() == one[0].positives.tolist() and three[3].positives.tolist() == one[1].positives.tolist()
    big = [set(s.positives.tolist()) for s in three[:3]]  # cluster 5 has 40 texts: three disjoint sets of 6
    assert all(len(p) == 6 for p in big) and not (big[0] & big[1]) and not (big[2] & (big[0] | big[1]))
    small = [set(s.positives.tolist()) for s in three[3:]]  # cluster 0 has 10, 4 not shown: drawn from all 10 again
    assert all(len(p) == 6 and set(LABELS[list(p)]) == {0} for p in small) and len(small[0] | small[1] | small[2]) > 6
    pr = probe_samples(idx, NEIGHBORS, three, 5, 3, 2, 3, seed=0)
    assert [p.cluster for p in pr] == [5, 0]
    shown5 = set(np.concatenate([np.concatenate([s.positives, s.hard, s.easy]) for s in three[:3]]).tolist())
    assert not set(pr[0].positives.tolist()) & shown5
    assert [p.positives.tolist() for p in probe_samples(idx, NEIGHBORS, one, 5, 3, 2, 3, seed=0)] != [p.positives.tolist() for p in pr]


def test_easy_negatives_rejection_path_on_a_big_corpus():
    labels = np.random.default_rng(0).integers(0, 100, 200_000)
    idx = ClusterIndex.build(labels, 100)
    nb = np.array([[(c + j) % 100 for j in range(1, 6)] for c in range(100)])
    s = contrastive_sample(idx, nb, 7, 6, 18, 18, 3, seed=0)
    assert len(s.easy) == 18
    assert not set(labels[s.easy]) & {7, 8, 9, 10}


def test_qaemb_articles():
    idx = ClusterIndex.build(LABELS)
    a = qaemb_articles(idx, 5, 10, seed=0)
    assert len(a) == 10 and set(LABELS[a]) == {5}

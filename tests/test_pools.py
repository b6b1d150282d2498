"""Pool sizes from declared resources (pure, no Ray)."""

from cqg_ray.pools import declared, fits, pool_range


def test_fits_counts_actors_by_their_scarcest_resource():
    assert fits({"CPU": 1}, {"CPU": 2}) == 2
    assert fits({"CPU": 1, "GPU": 1}, {"CPU": 16, "GPU": 4}) == 4
    assert fits({"GPU": 0.5}, {"CPU": 8}) == 0  # no GPU yet
    assert fits({"CPU": 0.3}, {"CPU": 0.9}) == 3


def test_a_pool_starts_with_one_actor_and_may_grow_to_what_is_declared():
    now = {"CPU": 2}
    assert pool_range({"CPU": 1}, now) == (1, 2)
    assert pool_range({"CPU": 1}, now, declared(now, max_cpus=64)) == (1, 64)
    # an autoscaling GPU cluster that starts with no GPU: one actor at first (pending until a GPU node comes), up to 8
    assert pool_range({"GPU": 1}, {"CPU": 4}, declared({"CPU": 4}, max_gpus=8)) == (1, 8)
    assert pool_range({"CPU": 1}, now, declared(now, max_cpus=64), cap=4) == (1, 4)  # a config's limit
    assert pool_range({"CPU": 1}, now, declared(now, max_cpus=64), work=3) == (1, 3)  # no more actors than work
    assert pool_range({"CPU": 1}, {"CPU": 8}, work=0) == (1, 1)
    assert pool_range({"CPU": 1}, now, fixed=5) == (5, 5)
    assert declared({"CPU": 8}, max_cpus=4) == {"CPU": 8}  # never below what is there

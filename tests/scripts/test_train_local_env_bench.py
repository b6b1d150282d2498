"""bench/train_local_env.py: the driver environment each side trains in (its real runs are the bench's: ~3 minutes)."""

import sys

from cqg_ray.pipeline import LOCAL_TRAIN_ENV
from tests.scripts import ROOT, load_script

sys.path.insert(0, str(ROOT / "bench"))  # its `_common` and `trainer`, as `python bench/train_local_env.py` finds them
bench = load_script("bench/train_local_env.py", "bench_train_local_env")


def test_rays_side_trains_without_the_local_settings_and_the_local_side_with_them():
    env = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "5", "PATH": "/bin"}
    bench.side_env("local", env)
    assert env == {**LOCAL_TRAIN_ENV, "PATH": "/bin"}
    bench.side_env("ray", env)
    assert env == {"PATH": "/bin"}
    assert bench.SIDES == ("ray", "local")

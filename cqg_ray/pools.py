"""(min, max) sizes of actor pools that follow the cluster (pure).

A Ray Data actor pool of ``ActorPoolStrategy(min_size, max_size)`` starts ``min_size`` actors and adds actors up to
``max_size`` while work is queued and the cluster has room, so on an autoscaling cluster the pool grows as nodes
arrive. ``min`` is 1 (one actor starts; the pool grows while work waits); ``max`` what fits the resources the cluster
is declared to reach (``ray.max_cpus`` / ``ray.max_gpus``, e.g. an autoscaler's worker limits times their sizes;
else what it has now), at least 1 even when nothing fits yet (a GPU pool on a cluster that starts without GPUs waits
for its first GPU node); a configured count fixes both.
"""

from __future__ import annotations

import math


def fits(per_actor: dict[str, float], resources: dict[str, float]) -> int:
    """Actors of ``per_actor`` resources that fit in ``resources`` (0 when a needed resource is absent)."""
    counts = [math.floor(float(resources.get(k, 0.0)) / v + 1e-9) for k, v in per_actor.items() if v > 0]
    return min(counts) if counts else 0


def node_cpus() -> list[float]:
    """The CPUs of each live node of the connected Ray cluster."""
    import ray

    return [float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")]


def declared(now: dict[str, float], max_cpus: float | None = None, max_gpus: float | None = None) -> dict[str, float]:
    """The resources the cluster may grow to: ``now``, raised to the declared CPU and GPU totals."""
    out = dict(now)
    if max_cpus is not None:
        out["CPU"] = max(float(out.get("CPU", 0.0)), max_cpus)
    if max_gpus is not None:
        out["GPU"] = max(float(out.get("GPU", 0.0)), max_gpus)
    return out


def pool_range(per_actor: dict[str, float], now: dict[str, float], most: dict[str, float] | None = None,
               fixed: int | None = None, cap: int | None = None, work: int | None = None) -> tuple[int, int]:
    """(min, max) actors: min 1, max = those that fit ``most`` (default ``now``; at least 1), at most ``cap`` (a
    config's limit) and ``work`` (items to do); ``fixed`` = exactly that many."""
    if fixed is not None:
        lo = hi = fixed
    else:
        lo, hi = 1, max(1, fits(per_actor, now if most is None else most))
    if cap is not None:
        hi = min(hi, cap)
    if work is not None:
        hi = min(hi, max(1, work))
    return min(lo, hi), max(1, hi)

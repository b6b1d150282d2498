"""The environment variables cqg-ray reads as numbers, checked: a value that is not one is a ConfigError naming the
variable (exit 2 on the command line), not a traceback in the middle of a stage."""

from __future__ import annotations

import math
import os


def env_seconds(name: str, default: float) -> float:
    """``$name`` as seconds above 0 (``default`` where it is unset or empty)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        from cqg_ray.config import ConfigError

        raise ConfigError(f"{name}={raw!r}: give a number of seconds above 0 (or unset it: {default:g})")
    return value

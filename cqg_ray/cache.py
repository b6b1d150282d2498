"""cqg-ray's machine cache: one root for the bundled models, exported encoders, measured rates, llama.cpp wheels and
the benches' folders. Standard library only: ``scripts/install_llama_cpp.py`` loads it before the package is installed.

    python -m cqg_ray.cache models      # the path, for shell scripts
"""

import os
import sys
from pathlib import Path

DEFAULT_CACHE_DIR = "~/.cache/cqg-ray"


def cache_root(cache_dir: str | None = None) -> Path:
    """``cache_dir``, else $CQG_RAY_CACHE, else $XDG_CACHE_HOME/cqg-ray, else ~/.cache/cqg-ray."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    default = os.path.join(xdg, "cqg-ray") if xdg else DEFAULT_CACHE_DIR
    return Path(os.path.expanduser(cache_dir or os.environ.get("CQG_RAY_CACHE") or default))


if __name__ == "__main__":
    print(cache_root().joinpath(*sys.argv[1:]))

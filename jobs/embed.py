"""Ray job entrypoint for batch embedding: the same as `cqg-ray embed`, for `ray job submit`.

    ray job submit --working-dir . -- python jobs/embed.py MODEL CORPUS... OUT [--output bits|probs] [--tau T]

Joins the cluster (`ray.init(address="auto")`) when RAY_ADDRESS is set, as it is inside a submitted job; otherwise
starts a local Ray. MODEL, CORPUS and OUT must be reachable from every node (shared disk or s3://, gs://, ...).
Rerun the same command after a failure: finished units are kept.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cqg_ray.embed import add_arguments, run_from_args
from cqg_ray.log import setup_logging


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jobs/embed.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    setup_logging()
    if args.address is None and os.environ.get("RAY_ADDRESS"):
        args.address = "auto"
    run_from_args(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

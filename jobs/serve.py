"""Ray job entrypoint for serving: deploy the Serve app of a model, for `ray job submit`.

    ray job submit --working-dir . -- python jobs/serve.py MODEL [--host 0.0.0.0 --port 8000 --replicas auto]

On a cluster (RAY_ADDRESS set, as inside a submitted job) it joins with `ray.init(address="auto")`, deploys the
application "cqg-mbqa" and returns: Serve applications outlive the job (`serve status`, `serve shutdown`).
Pass --wait to keep the job running until it is stopped (the app is then deleted). Without RAY_ADDRESS it starts
a local Ray and waits (Ctrl-C stops), like `cqg-ray serve`. Settings: the same flags and --config/--set as
`cqg-ray serve` (ServeConfig); the model folder must be reachable from every node.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from cqg_ray.config import RayConfig
from cqg_ray.log import setup_logging
from cqg_ray.serve.cli import add_arguments, serve_config, start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jobs/serve.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("--wait", action="store_true", help="keep running until stopped, then delete the app")
    p.add_argument("--name", default="cqg-mbqa", help="Serve application name")
    args = p.parse_args(argv)
    setup_logging()
    on_cluster = args.address is not None or bool(os.environ.get("RAY_ADDRESS"))
    from ray import serve

    from cqg_ray.pipeline import init_ray

    cfg = serve_config(args)
    init_ray(RayConfig(address=args.address or ("auto" if on_cluster else None), num_cpus=args.num_cpus))
    url = start(args.model, cfg, name=args.name)
    print(f"application {args.name!r} serving {args.model} at {url} (page: {url}/ui)", flush=True)
    if on_cluster and not args.wait:
        return 0
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(args.name) if on_cluster else serve.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

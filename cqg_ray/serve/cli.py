"""`cqg-ray serve MODEL`: serve a model with Ray Serve.

On this machine (no --address, no RAY_ADDRESS) it starts a local Ray and serves until Ctrl-C or SIGTERM (`kill`,
`docker stop`, systemd), then shuts Serve down. On a cluster
(--address, or RAY_ADDRESS as inside `ray job submit -- python -m cqg_ray.cli serve MODEL --host 0.0.0.0`) it
deploys the application and returns: Serve applications outlive the job (`serve status`, `serve shutdown`); --wait
keeps it running until stopped, then deletes the application. A local Ray starts with `THROUGHPUT_ENV` (Ray Serve's
throughput settings; on a cluster they belong in the environment of `ray start`, docs/serving.md). Settings come from the `serve` section of --config (a
pipeline YAML) and then the flags; the defaults bind 127.0.0.1:8000 with one replica. For a long-lived cluster
deployment, `serve deploy cqg_ray/configs/serve.yaml` does the same from a Serve config file.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time

from pydantic import ValidationError

from cqg_ray.config import ConfigError, RayConfig, ServeConfig, format_errors, load_config

# Ray Serve's throughput settings: those that RAY_SERVE_THROUGHPUT_OPTIMIZED=1 turns on, but direct ingress (which
# drops the HTTP proxy: clients would talk to each replica's own port). User code and routers run on the replica's
# and proxy's main event loops, the proxy reaches replicas over gRPC, request logs are buffered, the garbage
# collector is frozen after start-up. Measured by `bench/serve.py --peer infinity`: 84 -> 102 req/s on 2 cores.
THROUGHPUT_ENV = {
    "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    "RAY_SERVE_USE_GRPC_BY_DEFAULT": "1",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
    "RAY_SERVE_FREEZE_GC_ON_STARTUP": "1",
}


def use_throughput_env(environ=os.environ) -> dict[str, str]:
    """Put `THROUGHPUT_ENV` into the environment where the variable is not set already (the user's value wins), for
    a local Ray started after this; returns what was set."""
    added = {k: v for k, v in THROUGHPUT_ENV.items() if k not in environ}
    environ.update(added)
    return added


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `cqg-ray serve`."""
    p.add_argument("model", help="model folder (local path or URI reachable from the replicas) or a shipped model's name")
    p.add_argument("--config", "-c", help="pipeline YAML whose `serve` section to use")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                   help="override a serve value, e.g. max_batch_size=64 (or serve.max_batch_size=64)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--replicas", help="number of replicas, or 'auto' for autoscaling between min_replicas and max_replicas (default 1)")
    p.add_argument("--route-prefix", help="URL prefix of the app (default /)")
    p.add_argument("--api-key-env", help="environment variable holding a bearer token that clients must send")
    p.add_argument("--gpus-per-replica", type=float, help="GPUs per replica (default 0)")
    p.add_argument("--address", help="Ray address (default: the job's RAY_ADDRESS under `ray job submit`, else a new local Ray)")
    p.add_argument("--num-cpus", type=int, help="CPUs of a local Ray (default: all of this machine's)")
    p.add_argument("--name", default="cqg-mbqa", help="Serve application name (default cqg-mbqa)")
    p.add_argument("--wait", action="store_true", help="on a cluster: keep running until stopped, then delete the application "
                                                       "(default: deploy and return; the application stays up)")


def serve_config(args) -> ServeConfig:
    for s in args.set:  # load_config's own message names the prefixed key and section.key=value
        if "=" not in s:
            raise ConfigError(f"--set {s}: give KEY=VALUE, a key of the serve section, e.g. --set max_batch_size=64")
    overrides = [s if s.startswith("serve.") else f"serve.{s}" for s in args.set]  # serve.KEY as cqg-ray run's --set writes it
    cfg = load_config(args.config, overrides).serve
    flags = {"host": args.host, "port": args.port, "route_prefix": args.route_prefix, "api_key_env": args.api_key_env,
             "num_gpus_per_replica": args.gpus_per_replica}
    if args.replicas is not None:
        flags["num_replicas"] = args.replicas
    try:  # flags checked as the config's own keys are, before Ray starts
        return ServeConfig.model_validate({**cfg.model_dump(), **{k: v for k, v in flags.items() if v is not None}})
    except ValidationError as e:  # (route_prefix: Ray Serve's rule, which serve.run would say with a traceback)
        raise ConfigError(format_errors(e, "the serve options")) from None


def open_to_others(cfg: ServeConfig) -> str | None:
    """A warning when the server would answer other machines (a --host other than loopback) with no bearer key, else None."""
    if cfg.api_key_env or cfg.host in ("localhost", "::1") or cfg.host.startswith("127."):
        return None
    return (f"warning: serving on {cfg.host} without --api-key-env: anyone who can reach port {cfg.port} can use the API "
            "(set a key, or bind 127.0.0.1)")


def port_taken(host: str, port: int) -> str | None:
    """Why a local server cannot listen on host:port (the name does not resolve, or the address is in use or not this
    machine's), or None. A plain bind, without SO_REUSEPORT: Ray Serve's proxy sets that option, so a second proxy
    would share the port with the first and the kernel would split the clients between the two."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"--host {host}: the name does not resolve ({e.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        try:
            s.bind(address)
        except OSError as e:
            return f"{host}:{port}: {e.strerror} (another server listens there, or the address is not this machine's)"
    return None


def local_shortfall(cfg: ServeConfig, num_cpus: int | None, num_gpus: int | None = None) -> str | None:
    """Why a local Ray of ``num_cpus`` CPUs (None: this machine's, as Ray counts them) and ``num_gpus`` GPUs (None: torch's
    count) cannot hold the replicas Serve must start (num_replicas, or at least one of min_replicas for auto), or None.
    Serve would wait for them without end, and say nothing."""
    replicas = max(cfg.min_replicas, 1) if cfg.num_replicas == "auto" else cfg.num_replicas
    if num_cpus is None:
        try:
            from ray._private.utils import get_num_cpus  # Ray's own count (cgroup limits included)
            num_cpus = get_num_cpus()
        except Exception:
            num_cpus = os.cpu_count() or 1
    if num_gpus is None and cfg.num_gpus_per_replica:
        import torch

        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for need, have, what, flag in ((replicas * cfg.num_cpus_per_replica, num_cpus, "CPU", "num_cpus_per_replica"),
                                   (replicas * cfg.num_gpus_per_replica, num_gpus or 0, "GPU", "--gpus-per-replica")):
        if need > have + 1e-9:
            each = getattr(cfg, f"num_{what.lower()}s_per_replica")
            who = f"{replicas} replicas of {each:g} {what} each need" if replicas > 1 else f"1 replica of {each:g} {what} needs"
            advice = " (--set num_cpus_per_replica=0.5), or raise --num-cpus" if what == "CPU" else ""
            return f"{who} {need:g} {what}{'s' if need != 1 else ''}; this local Ray has {have:g}: lower --replicas or {flag}{advice}"
    return None


def start(model: str, cfg: ServeConfig, name: str = "cqg-mbqa") -> str:
    """Start Serve's HTTP proxy on cfg.host:cfg.port and deploy the app; returns the base URL (Ray must be up)."""
    from ray import serve

    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.mbqa.folder import resolve_model
    from cqg_ray.serve.app import build_app

    model = resolve_model(model)  # a shipped model's name -> its folder, so that every replica reads the same one
    InterpretableEmbedder.load(model, load_encoder=False, device="cpu")  # a bad folder fails here, not in a replica
    serve.start(http_options={"host": cfg.host, "port": cfg.port}, logging_config={"enable_access_log": False})
    serve.run(build_app(model, cfg), name=name, route_prefix=cfg.route_prefix, logging_config={"enable_access_log": False})
    return base_url(cfg.host, cfg.port, cfg.route_prefix)


def base_url(host: str, port: int, route_prefix: str = "/") -> str:
    """The URL a client on this machine reaches a server bound to host:port at: 127.0.0.1 for the any-address binds,
    an IPv6 address in brackets (RFC 3986: http://[::1]:8000, where http://::1:8000 is no URL)."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    if ":" in host:
        host = "[" + host.replace("%", "%25") + "]"  # a zone id's % escaped (RFC 6874)
    return f"http://{host}:{port}{route_prefix.rstrip('/')}"


def take_down(name: str, on_cluster: bool) -> None:
    """Remove the application: on a cluster's Serve its own (others stay), on this process's local Ray all of Serve."""
    from ray import serve

    serve.delete(name) if on_cluster else serve.shutdown()


def cmd_serve(args) -> int:
    from cqg_ray.mbqa.embedder import InterpretableEmbedder
    from cqg_ray.pipeline import init_ray, ray_address
    from cqg_ray.serve.app import key_problem

    cfg = serve_config(args)
    address = ray_address(args.address, None)
    try:  # --num-cpus too, before the model loads and Ray starts
        ray_cfg = RayConfig(address=address, num_cpus=args.num_cpus)
    except ValidationError as e:
        raise ConfigError(format_errors(e, "the Ray options")) from None
    if cfg.api_key_env and (why := key_problem(os.environ.get(cfg.api_key_env, "").strip())) is not None:  # as the replicas read it
        print(f"error: --api-key-env {cfg.api_key_env}: that environment variable {why}", file=sys.stderr)
        return 2
    InterpretableEmbedder.load(args.model, load_encoder=False, device="cpu")  # a bad folder fails before Ray starts
    if address is None:  # a local Ray: its proxy listens on this machine
        if (why := port_taken(cfg.host, cfg.port)) is not None:
            advice = "choose another --host" if why.startswith("--host") else "choose another --port"
            print(f"error: cannot serve on {why}; {advice}", file=sys.stderr)
            return 2
        if (why := local_shortfall(cfg, args.num_cpus)) is not None:
            raise ConfigError(why)
        use_throughput_env()
    if warning := open_to_others(cfg):  # once the address is known to be usable here
        print(warning, file=sys.stderr, flush=True)
    init_ray(ray_cfg)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # not Ray's stack dump while the replicas start
    try:
        url = start(args.model, cfg, name=args.name)
    except RuntimeError as e:  # Serve's "Deploying application ... failed": a replica's constructor raised
        why = deploy_failure(args.name) or str(e)
        take_down(args.name, on_cluster=address is not None)
        print(f"error: the application did not start: {why}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before it served (the CLI's own line would say to run it again to resume)
        print("stopped before the application was up", file=sys.stderr, flush=True)
        take_down(args.name, on_cluster=address is not None)
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    print(f"serving {args.model} at {url}/ui  (application {args.name!r}; API: {url}/embed, {url}/explain, {url}/questions, "
          f"{url}/v1/embeddings)", flush=True)
    if address is not None and not args.wait:
        return 0  # on a cluster the application outlives this process
    try:
        wait_for_stop("Ctrl-C stops")
        print("stopping", flush=True)
    finally:
        take_down(args.name, on_cluster=address is not None)
    return 0


def deploy_failure(name: str) -> str | None:
    """Why application ``name`` failed to deploy, from Serve's status: the last line of a deployment's message (the
    replica's exception, e.g. "ModelError: cannot load the encoder ..."), else None."""
    from ray import serve

    try:
        app = serve.status().applications.get(name)
    except Exception:  # the controller is gone: Serve's own message will do
        return None
    for d in (app.deployments.values() if app else []):
        lines = [line.strip() for line in (d.message or "").splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return None


def wait_for_stop(ready: str) -> None:
    """Print ``ready``, then block until Ctrl-C (SIGINT) or SIGTERM. SIGTERM is taken from Ray's handler, which dumps
    a stack trace and ends the process at once, so that the caller shuts Serve down as it does on Ctrl-C. The handler
    is in place before ``ready`` is printed, so a signal sent after that line ends the wait."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt, as SIGINT does
    try:
        print(ready, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)  # None: a handler set outside Python


def add_commands(sub) -> None:
    p = sub.add_parser("serve", help="serve a model over HTTP with Ray Serve (embed, explain, questions, OpenAI embeddings, a page)",
                       description="Serve a trained model: POST /embed, POST /explain, GET /questions, POST /v1/embeddings "
                                   "(OpenAI schema), GET /healthz and the page GET /ui. Binds 127.0.0.1 unless --host says otherwise.")
    add_arguments(p)
    p.set_defaults(func=cmd_serve)

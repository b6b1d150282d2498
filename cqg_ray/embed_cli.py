"""`cqg-ray embed MODEL CORPUS OUT`: the flags, and the `embed` section of --config (flags given win), to ``embed.embed``."""

from __future__ import annotations

import argparse
import json
import os
from typing import get_args

from cqg_ray.config import BACKEND_HELP, TOKENIZE_STAGE_HELP, ConfigError, CorpusConfig, EmbedConfig, EncoderBackend, RayConfig, format_errors
from cqg_ray.embed import embed
from cqg_ray.lease import take_lease
from cqg_ray.rundir import RunDir


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `cqg-ray embed`."""
    p.add_argument("model", help="model folder (local path or URI) or a shipped model's name")
    p.add_argument("corpus", nargs="+", help="corpus files, folders or globs (jsonl, parquet, csv, tsv, txt, optionally .gz)")
    p.add_argument("out", help="output folder (local path or URI, reachable from every node)")
    p.add_argument("--config", "-c", help="pipeline YAML whose `embed` section gives the defaults of the flags below (a flag given "
                                          "wins); `cqg-ray config --keys embed` lists its keys")
    p.add_argument("--set", "-s", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the embed section, e.g. --set batch_size=256 (YAML values)")
    p.add_argument("--output", choices=["sparse", "bits", "probs"], default=None,
                   help="default bits. sparse: the active questions' indices (uint16) and values (float16), about 4 bytes each; bits: the "
                        "active questions packed (m/8 bytes a text); probs: float16 probabilities (2m bytes a text)")
    p.add_argument("--k", type=int, default=None, help="at most k active questions per text (default: the model's budget)")
    p.add_argument("--tau", type=float, default=None, help="the tau rule instead of the model's budget: active when p > tau, "
                                                           "valued as the budget values its answers (0/1, the paper's, for value one)")
    p.add_argument("--format", default="auto", choices=["auto", "jsonl", "parquet", "csv", "tsv", "txt", "medi2"],
                   help="corpus format (default auto: from each file's extension)")
    p.add_argument("--text-column", default="text", help="column or JSON field holding the text (default text)")
    p.add_argument("--id-column", default=None, help="column with document ids (default: a hash of file, line and text)")
    p.add_argument("--batch-size", type=int, default=None, help="texts per encoder call (default 32 on CPU, 128 on GPU)")
    p.add_argument("--backend", default=None, choices=get_args(EncoderBackend), help=BACKEND_HELP)
    p.add_argument("--unit-rows", type=int, default=None, help="rows per work unit, the resume granularity (default 10000)")
    p.add_argument("--tokenize-stage", choices=["auto", "on", "off"], default=None, help=TOKENIZE_STAGE_HELP)
    p.add_argument("--tokenize-actors", type=int, default=None,
                   help="CPU actors of the tokenizing stage at most (default: two per GPU actor; one beside CPU actors)")
    p.add_argument("--actors", type=int, default=None, help="actors (default: one per GPU, else one per CPU, growing with the cluster "
                                                             "up to --max-gpus / --max-cpus)")
    p.add_argument("--gpus-per-actor", type=float, default=None, help="default: 1 when the cluster has GPUs, else 0")
    p.add_argument("--threads", type=int, default=None, help="torch threads per CPU actor, at least (default 1; more where fewer units "
                                                          "than CPUs leave cores idle)")
    p.add_argument("--address", default=None, help="Ray address (default: the job's RAY_ADDRESS under `ray job submit`, else a local Ray)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of a local Ray")
    p.add_argument("--max-cpus", type=float, default=None, help="CPUs the cluster may grow to (an autoscaler's limit; default: those present)")
    p.add_argument("--max-gpus", type=float, default=None, help="GPUs the cluster may grow to (an autoscaler's limit; default: those present)")
    p.add_argument("--force", action="store_true", help="throw away OUT's previous results and start again")
    p.add_argument("--break-lease", action="store_true", help="write OUT even if another live `cqg-ray embed` holds its lease (that one stops)")


def embed_config(args) -> EmbedConfig:
    """The `embed` section of --config (default: the defaults) with --set over it, and the flags given over that; --k
    given clears the section's tau, and --tau its k."""
    from pydantic import ValidationError

    from cqg_ray.config import load_config

    if bad := [s for s in args.set if "=" not in s]:
        raise ConfigError(f"--set {bad[0]}: give KEY=VALUE, a key of the embed section, e.g. --set batch_size=256")
    section = load_config(args.config, [s if s.startswith("embed.") else f"embed.{s}" for s in args.set]).embed.model_dump()
    flags = {"output": args.output, "tau": args.tau, "k": args.k, "batch_size": args.batch_size, "num_actors": args.actors,
             "num_gpus_per_actor": args.gpus_per_actor, "unit_rows": args.unit_rows, "torch_threads": args.threads,
             "backend": args.backend, "tokenize_stage": args.tokenize_stage, "tokenize_actors": args.tokenize_actors}
    if args.k is not None or args.tau is not None:  # the flag's rule in place of the section's
        section.update(k=None, tau=None)
    try:
        return EmbedConfig.model_validate({**section, **{k: v for k, v in flags.items() if v is not None}})
    except ValidationError as err:
        raise ConfigError(format_errors(err, "the embed options")) from None


def run_from_args(args) -> dict:
    from cqg_ray.pipeline import init_ray, ray_address

    from pydantic import ValidationError

    cfg = embed_config(args)
    try:
        corpus = CorpusConfig(format=args.format, text_column=args.text_column, id_column=args.id_column)
        cluster = RayConfig(address=ray_address(args.address, None), num_cpus=args.num_cpus, max_cpus=args.max_cpus, max_gpus=args.max_gpus)
    except ValidationError as err:  # a bad option (--num-cpus -1 too): said before OUT and its lease are made
        raise ConfigError(format_errors(err, "the embed options")) from None
    from cqg_ray.artifacts import file_on_path

    if "://" not in args.out and (above := file_on_path(args.out)) is not None:  # OUT, or a file on its path (notes.txt/emb)
        where = "is a file" if above == os.path.normpath(args.out) else f"is below the file {above}"
        raise ConfigError(f"OUT {args.out} {where}: give a folder to write the embeddings to")
    inside = [c for c in args.corpus if "://" not in c and "://" not in args.out and not any(ch in c for ch in "*?[")
              and os.path.isdir(c) and os.path.commonpath([os.path.abspath(c), os.path.abspath(args.out)]) == os.path.abspath(c)]
    if inside:  # its units and snapshot would be read as corpus by the next run (a rerun failed, a resume could not)
        raise ConfigError(f"OUT {args.out} is inside the corpus folder {inside[0]}: its files would be read as corpus next time; "
                          "give an OUT outside it")
    if RunDir(args.out).exists("config.json"):  # embed's lease, manifest and units would lie among the model's files
        raise ConfigError(f"OUT {args.out} is a model folder (config.json): give a folder of its own to write the embeddings to")
    if cfg.k is not None and cfg.tau is not None:
        raise ConfigError("give --k (top-k) or --tau (the tau rule), not both")
    from cqg_ray.mbqa.embedder import InterpretableEmbedder

    m = InterpretableEmbedder.load(args.model, load_encoder=False, device="cpu").m  # a missing model or a --k over m: before the lease and Ray
    if cfg.k is not None and cfg.k > m:
        raise ConfigError(f"--k must be from 1 to m={m} (the model's questions), got {cfg.k}")
    from cqg_ray.corpus import list_files

    files = list_files(list(args.corpus), corpus.format)  # a path not found, a folder or glob with no file: CorpusError, before OUT is made
    if corpus.id_column and (txt := [u for u, f in files if f == "txt"]):
        raise ConfigError(f"{txt[0]}: a .txt file holds one text a line and no ids: drop --id-column ({corpus.id_column!r}), "
                          "or give the ids in a jsonl, csv or parquet file")
    out_abs = os.path.abspath(args.out)
    if "://" not in args.out and (taken := [u for u, _ in files if "://" not in u and os.path.commonpath([os.path.abspath(u), out_abs]) == out_abs]):
        raise ConfigError(f"the corpus paths match {taken[0]}, a file inside OUT {args.out} (an earlier run's output): its files "
                          "would be read as corpus; give an OUT outside what the corpus paths match")
    with take_lease(args.out, "cqg-ray embed", args.break_lease):  # one writer per OUT (LeaseHeld: exit 3)
        if RunDir(args.out).exists("config.yaml"):  # under its lease: a live run's directory is said to be in use (exit 3)
            raise ConfigError(f"OUT {args.out} is a pipeline run directory (config.yaml): give a folder of its own to write the "
                              "embeddings to")
        init_ray(cluster)
        m = embed(args.model, args.corpus, args.out, cfg, corpus, force=args.force,
                  progress=os.environ.get("CQG_RAY_PROGRESS", "1") != "0", cluster=cluster, files=files)
    print(json.dumps({k: m.get(k) for k in ("format", "m", "output", "budget", "bytes_per_text", "file_bytes_per_text", "counts",
                                            "texts_per_s", "seconds")}, indent=2))
    return m


def add_commands(sub) -> None:
    p = sub.add_parser("embed", help="embed a corpus with a trained model (Ray Data; Parquet of sparse active questions, packed bits or probabilities)",
                       description="Embed every row of a corpus with a trained model into Parquet files under OUT "
                                   "(doc_id, and indices and values for --output sparse, else embedding). Resumable: run the same command "
                                   "again after a kill. On a cluster: "
                                   "ray job submit --working-dir . -- python -m cqg_ray.cli embed MODEL CORPUS OUT "
                                   "(MODEL, CORPUS and OUT reachable from every node: shared disk or s3://, gs://).")
    add_arguments(p)
    from cqg_ray.cli import unwinds_on_sigterm

    # SIGTERM (`kill`, `ray job stop`) unwinds as Ctrl-C does: the lease given back, exit 143; Ray's handler dumped a stack
    p.set_defaults(func=unwinds_on_sigterm(lambda args: 0 if run_from_args(args) else 1), resumes=True)

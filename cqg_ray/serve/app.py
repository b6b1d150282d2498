"""The Ray Serve application: FastAPI routes (thin) over `EmbeddingService` (the logic), as one deployment.

    POST /embed            texts -> bits | probabilities | packed bits (optional tau)
    POST /explain          two texts -> shared yes questions, differing questions, cosine, cognitive load
    GET  /questions        the m questions with their yes-rates
    POST /v1/embeddings    OpenAI embeddings schema (the `openai` client works unchanged); GET /v1/models
    GET  /healthz          liveness (no token needed)
    GET  /ui               the page (static/index.html): compare two texts, browse the questions

Every POST body is read here with a byte cap (413), parsed and validated by `service.parse_json` (400/422),
then checked against the limits (413/422); a bearer token is checked first when one is configured (401).
Unknown routes answer 404, wrong methods 405, all in OpenAI's error shape; none of these reach the model.

    app = build_app("runs/demo/model", ServeConfig(max_batch_size=32))     # a serve.Application
    serve.run(app, route_prefix="/")
    # serve deploy cqg_ray/configs/serve.yaml  ->  import_path: cqg_ray.serve.app:app_builder
"""

from __future__ import annotations

import importlib.resources
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from cqg_ray.config import ServeConfig
from cqg_ray.serve.protocol import (
    ApiError,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    ExplainRequest,
    ExplainResponse,
    Health,
    ModelList,
    QuestionsResponse,
)
from cqg_ray.serve.service import EmbeddingService, check_bearer, parse_json, read_token

log = logging.getLogger("cqg_ray")

app = FastAPI(title="cqg-ray", description="Interpretable text embeddings: every dimension answers a yes/no question (CQG-MBQA).",
              version="1")

PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@app.exception_handler(ApiError)
async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


@app.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    msg = {404: f"no route {request.url.path}: see GET /ui, GET /questions, POST /embed, POST /explain, POST /v1/embeddings",
           405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    return JSONResponse(ApiError(exc.status_code, msg, code=code).body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))


@app.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse(ApiError(422, str(exc.errors()[0].get("msg", "invalid request"))).body(), status_code=422)


@app.exception_handler(Exception)
async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse(ApiError(500, f"internal error: {type(exc).__name__}", type="server_error").body(), status_code=500)


def _body_schema(model) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes (413 beyond), if it is declared as JSON (415 otherwise)."""
    ctype = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype and ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(415, f"Content-Type must be application/json, got {ctype!r}", code="unsupported_media_type")
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise ApiError(400, f"invalid Content-Length {declared!r}", code="bad_content_length")
    if declared is not None and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes; at most {limit}", code="body_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"request body over {limit} bytes", code="body_too_large")
    return bytes(body)


class EmbedderServer(EmbeddingService):
    """One replica: the model, the batch queue, and the routes (each route: check, parse, delegate)."""

    def __init__(self, model_path: str, serve_cfg: dict):
        import torch

        from cqg_ray.mbqa.embedder import InterpretableEmbedder

        cfg = ServeConfig.model_validate(serve_cfg)
        if not torch.cuda.is_available():
            torch.set_num_threads(cfg.torch_threads)
        self.token = read_token(cfg)
        super().__init__(InterpretableEmbedder.load(model_path), cfg)
        self.page = importlib.resources.files("cqg_ray.serve").joinpath("static/index.html").read_text(encoding="utf-8")

    async def _request(self, request: Request, schema):
        check_bearer(request.headers.get("authorization"), self.token)
        return parse_json(await read_body(request, self.cfg.max_request_bytes), schema)

    @app.get("/healthz", response_model=Health)
    def healthz(self) -> Health:
        return self.health()

    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    def ui(self) -> HTMLResponse:
        return HTMLResponse(self.page, headers={"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff",
                                                "Cache-Control": "no-cache"})

    @app.get("/questions", response_model=QuestionsResponse)
    def list_questions(self, request: Request) -> QuestionsResponse:
        check_bearer(request.headers.get("authorization"), self.token)
        return self.questions()

    @app.post("/embed", response_model=EmbedResponse, openapi_extra=_body_schema(EmbedRequest))
    async def post_embed(self, request: Request) -> EmbedResponse:
        return await self.embed(await self._request(request, EmbedRequest))

    @app.post("/explain", response_model=ExplainResponse, openapi_extra=_body_schema(ExplainRequest))
    async def post_explain(self, request: Request) -> ExplainResponse:
        return await self.explain(await self._request(request, ExplainRequest))

    @app.post("/v1/embeddings", response_model=EmbeddingsResponse, openapi_extra=_body_schema(EmbeddingsRequest))
    async def post_embeddings(self, request: Request) -> EmbeddingsResponse:
        return await self.openai_embeddings(await self._request(request, EmbeddingsRequest))

    @app.get("/v1/models", response_model=ModelList)
    def list_models(self, request: Request) -> ModelList:
        check_bearer(request.headers.get("authorization"), self.token)
        return self.models()


EmbedderDeployment = serve.deployment(name="EmbedderServer")(serve.ingress(app)(EmbedderServer))


def deployment_options(cfg: ServeConfig, env_vars: dict[str, str] | None = None) -> dict:
    """Serve deployment options from the config: replicas or autoscaling, CPUs/GPUs per replica, in-flight cap."""
    actor = {"num_cpus": cfg.num_cpus_per_replica, "num_gpus": cfg.num_gpus_per_replica}
    if env_vars:
        actor["runtime_env"] = {"env_vars": dict(env_vars)}
    opts = {
        "ray_actor_options": actor,
        "max_ongoing_requests": cfg.max_ongoing_requests or max(16, 4 * cfg.max_batch_size),
        "logging_config": {"enable_access_log": False},
    }
    if cfg.num_replicas == "auto":
        opts["autoscaling_config"] = {"min_replicas": cfg.min_replicas, "max_replicas": cfg.max_replicas,
                                      "target_ongoing_requests": cfg.target_ongoing_requests}
    else:
        opts["num_replicas"] = cfg.num_replicas
    return opts


def build_app(model_path: str, cfg: ServeConfig | None = None, env_vars: dict[str, str] | None = None):
    """The Serve application for a model folder (local path or URI reachable from the replicas)."""
    cfg = cfg or ServeConfig()
    return EmbedderDeployment.options(**deployment_options(cfg, env_vars)).bind(model_path, cfg.model_dump(mode="json"))


def app_builder(args: dict):
    """Application builder for `serve run` / `serve deploy` (import_path: cqg_ray.serve.app:app_builder).

    args: model (required), config (a pipeline YAML; its `serve` section is used), serve (overrides of it).
    """
    from cqg_ray.config import load_config

    if not isinstance(args, dict) or not args.get("model"):
        raise ValueError("the application needs args.model: the model folder to serve")
    base = load_config(args["config"]).serve.model_dump() if args.get("config") else {}
    cfg = ServeConfig.model_validate({**base, **(args.get("serve") or {})})
    return build_app(str(args["model"]), cfg)

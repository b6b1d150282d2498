"""The HTTP layer: typed FastAPI routes over `EmbeddingService`, and the Ray Serve deployment that hosts them.

    POST /embed            texts -> active questions (sparse: indices + values; bits; packed bits) or probabilities (optional k or tau)
    POST /explain          two texts -> shared yes questions, differing questions, cosine, cognitive load
    GET  /questions        the m questions with their yes-rates
    POST /v1/embeddings    OpenAI embeddings schema (the `openai` client works unchanged); GET /v1/models
    GET  /healthz          liveness (no key needed)
    GET  /ui               the page (static/index.html): compare two texts, browse the questions

A request passes, in order: `RequestLimits` (an ASGI middleware: headers over `max_header_bytes` 431, a body over
`max_request_bytes` 413), the route (unknown 404, wrong method 405), `require_key` (the one auth dependency:
401 without the server's bearer key, when it has one), FastAPI's parsing of the body into the route's pydantic
type (not JSON 400, another content type 415, a wrong shape 422), then the service's limits (413/422). Every
error answer has OpenAI's shape (`protocol.ErrorResponse`); none of these reach the model.

    api = build_api(EmbeddingService(model, cfg))                         # a FastAPI app (TestClient, uvicorn)
    app = build_app("runs/demo/model", ServeConfig(max_batch_size=32))     # a serve.Application
    serve.run(app, route_prefix="/")
    # serve deploy cqg_ray/configs/serve.yaml  ->  import_path: cqg_ray.serve.app:app_builder
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.resources
import json
import logging
import os
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cqg_ray.config import ServeConfig
from cqg_ray.serve.protocol import (
    ApiError,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorResponse,
    ExplainRequest,
    ExplainResponse,
    Health,
    ModelList,
    QuestionsResponse,
    json_type,
)
from cqg_ray.serve.service import EmbeddingService

log = logging.getLogger("cqg_ray")

MAX_HEADER_BYTES = 16 * 1024  # all request headers together (names and values), as h11's default limit
PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
            "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


# --------------------------------------------------------------------------------------------- request checks


# a 408 leaves the rest of the body unread: the connection closes after the answer (RFC 9110, 15.5.9)
ERROR_HEADERS = {401: {"WWW-Authenticate": "Bearer"}, 408: {"Connection": "close"}}


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=ERROR_HEADERS.get(e.status))



class RequestLimits:
    """ASGI middleware: 431 for request headers over `max_header_bytes`, 415 for a compressed body (Content-Encoding
    other than identity), 413 for a body over `max_body_bytes`
    (by its Content-Length, else as it arrives; 400 for a Content-Length that is not a number), 408 for a body
    that has not arrived whole within `body_timeout_s`. The body is read here, within the limits, and handed on
    unchanged."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float, max_header_bytes: int = MAX_HEADER_BYTES):
        self.app, self.max_body_bytes, self.body_timeout_s, self.max_header_bytes = app, max_body_bytes, body_timeout_s, max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            body = await self.checked_body(scope, receive)
        except ApiError as e:
            return await error_response(e)(scope, receive, send)
        if body is None:  # the client went away
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def checked_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The request body, once headers and body are within the limits (None when the client went away)."""
        headers = scope["headers"]
        size = sum(len(k) + len(v) for k, v in headers)
        if size > self.max_header_bytes:
            raise ApiError(431, f"request headers of {size} bytes; at most {self.max_header_bytes}", code="headers_too_large")
        encoding = next((v.decode("latin-1").strip() for k, v in headers if k == b"content-encoding"), "")
        if encoding.lower() not in ("", "identity"):  # a compressed body would otherwise be read as JSON: "not UTF-8"
            raise ApiError(415, f"Content-Encoding {encoding!r} is not supported: send the body uncompressed", code="unsupported_encoding")
        declared = next((v.decode("latin-1") for k, v in headers if k == b"content-length"), None)
        if declared is not None and not (declared.isascii() and declared.isdigit()):  # "²" is a digit to isdigit
            raise ApiError(400, f"invalid Content-Length {declared!r}", code="bad_content_length")
        if declared is not None and int(declared) > self.max_body_bytes:
            raise ApiError(413, f"request body of {declared} bytes; at most {self.max_body_bytes}", code="body_too_large")
        body, more = bytearray(), True
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while more:
                    message = await receive()
                    if message["type"] != "http.request":
                        return None
                    body += message.get("body", b"")
                    more = message.get("more_body", False)
                    if len(body) > self.max_body_bytes:
                        raise ApiError(413, f"request body over {self.max_body_bytes} bytes", code="body_too_large")
        except TimeoutError:
            raise ApiError(408, f"request body not received within {self.body_timeout_s:g} s ({len(body)} bytes came)", code="body_timeout") from None
        return bytes(body)


def check_bearer(header: str | None, key: str | None) -> None:
    """401 unless `Authorization: Bearer <key>` matches (nothing to check when the server has no key)."""
    if key is None:
        return
    if not header:
        raise ApiError(401, "missing Authorization header: send 'Authorization: Bearer <token>'", type="authentication_error", code="missing_token")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(401, "Authorization must be 'Bearer <token>'", type="authentication_error", code="bad_scheme")
    if not hmac.compare_digest(given.strip().encode(), key.encode()):
        raise ApiError(401, "invalid bearer token", type="authentication_error", code="invalid_token")


async def require_key(request: Request) -> None:
    """The auth dependency: the server's bearer key (app.state.api_key), if it has one. Async, so that FastAPI runs it
    on the event loop instead of handing every request to its thread pool."""
    check_bearer(request.headers.get("authorization"), request.app.state.api_key)


def key_problem(key: str) -> str | None:
    """Why `key` (stripped) cannot be a bearer token, or None: empty, or not printable ASCII (HTTP clients send header
    values as ASCII, so no client could present it)."""
    if not key:
        return "is not set or holds only whitespace"
    if not (key.isascii() and key.isprintable()):
        return "holds characters other than printable ASCII, which an Authorization header cannot carry"
    return None


def read_api_key(cfg: ServeConfig) -> str | None:
    """The bearer key from the environment variable named by `api_key_env` (None = no authentication)."""
    if cfg.api_key_env is None:
        return None
    key = os.environ.get(cfg.api_key_env, "").strip()
    if (why := key_problem(key)) is not None:
        raise RuntimeError(f"serve.api_key_env={cfg.api_key_env!r}: that environment variable {why} in the replica: "
                           "set it (runtime_env env_vars on a cluster) or drop api_key_env")
    return key


def invalid_body(exc: RequestValidationError, body: bytes, content_type: str | None) -> ApiError:
    """FastAPI's validation error of a request body -> our answer: 415 not declared JSON, 400 empty or not JSON,
    422 a wrong shape (the first problem, by field, and how many more)."""
    ctype = (content_type or "application/json").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        return ApiError(415, f"Content-Type must be application/json, got {ctype!r}", code="unsupported_media_type")
    if not body.strip():
        return ApiError(400, "empty request body: send a JSON object", code="empty_body")
    errors = exc.errors()
    first = errors[0]
    if first["type"] == "json_invalid":
        text, pos = body.decode("utf-8", "replace"), int(first["loc"][-1])
        line, column = text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos)
        reason = str(first["ctx"]["error"]).removesuffix(" at")  # json's "Invalid control character at"
        return ApiError(400, f"request body is not valid JSON: {reason} at line {line} column {column}", code="invalid_json")
    loc = tuple(first["loc"][1:]) if first["loc"][:1] == ("body",) else tuple(first["loc"])
    if not loc and first["type"] in ("missing", "model_type", "model_attributes_type", "dict_type"):
        return ApiError(422, f"request body must be a JSON object, got a JSON {json_type(json.loads(body))}", code="invalid_type")
    where = ".".join(str(p) for p in loc)
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    msg = first["msg"].removeprefix("Value error, ")
    if not loc:  # a check across fields (k and tau, packed and output): its message names them
        return ApiError(422, f"{msg}{more}", code="invalid_value")
    return ApiError(422, f"{where}: {msg}{more}", code="invalid_value", param=where)


def unreadable_body(cause: BaseException | None) -> ApiError:
    """FastAPI's 400 for a body that json.loads could not take -> why."""
    if isinstance(cause, UnicodeDecodeError):
        return ApiError(400, f"request body is not UTF-8 text ({cause.reason} at byte {cause.start})", code="invalid_json")
    if isinstance(cause, RecursionError):
        return ApiError(400, "request body is not usable JSON: nested too deeply", code="invalid_json")
    return ApiError(400, "request body is not usable JSON", code="invalid_json")


# --------------------------------------------------------------------------------------------- routes


async def get_service(request: Request) -> EmbeddingService:
    """The app's service (async: FastAPI runs a plain def dependency on a worker thread, a thread hop per request)."""
    return request.app.state.service


Service = Annotated[EmbeddingService, Depends(get_service)]
KEY = [Depends(require_key)]
router = APIRouter(responses={code: {"model": ErrorResponse} for code in (400, 401, 413, 415, 422, 431)})


@router.get("/healthz")
@router.head("/healthz", include_in_schema=False)  # uptime probes that ask without a body (one route a method: one operation id each)
def healthz(svc: Service) -> Health:
    return svc.health()


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
def ui(request: Request) -> HTMLResponse:
    return HTMLResponse(request.app.state.page, headers={"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff",
                                                         "Cache-Control": "no-cache"})


@router.get("/questions", dependencies=KEY)
def questions(svc: Service) -> QuestionsResponse:
    return svc.questions()


@router.post("/embed", dependencies=KEY)
async def embed(req: EmbedRequest, svc: Service) -> EmbedResponse:
    return await svc.embed(req)


@router.post("/explain", dependencies=KEY)
async def explain(req: ExplainRequest, svc: Service) -> ExplainResponse:
    return await svc.explain(req)


@router.post("/v1/embeddings", dependencies=KEY)
async def embeddings(req: EmbeddingsRequest, svc: Service) -> EmbeddingsResponse:
    return await svc.openai_embeddings(req)


@router.get("/v1/models", dependencies=KEY)
def models(svc: Service) -> ModelList:
    return svc.models()


# --------------------------------------------------------------------------------------------- the app


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(exc)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not parse the body
        return error_response(unreadable_body(exc.__cause__))
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    at = request.scope.get("root_path", "").rstrip("/")  # the route prefix, under which the routes are
    msg = {404: f"no route {request.url.path}: see GET {at}/ui, GET {at}/questions, POST {at}/embed, POST {at}/explain, POST {at}/v1/embeddings",
           405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    return JSONResponse(ApiError(exc.status_code, msg, code=code).body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(invalid_body(exc, await request.body(), request.headers.get("content-type")))


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return error_response(ApiError(500, f"internal error: {type(exc).__name__}", type="server_error"))


def build_api(service: EmbeddingService, api_key: str | None = None, max_header_bytes: int = MAX_HEADER_BYTES) -> FastAPI:
    """The FastAPI app over one service; with `api_key`, every route but /healthz and /ui needs it as a bearer token
    (the schema /openapi.json too; FastAPI's /docs and /redoc pages, which a browser would load without the token,
    are then off)."""
    api = FastAPI(title="cqg-ray", version="1", strict_content_type=False, openapi_url=None if api_key else "/openapi.json",
                  description="Interpretable text embeddings: every dimension answers a yes/no question (CQG-MBQA).")
    if api_key:
        api.add_api_route("/openapi.json", lambda: JSONResponse(api.openapi()), include_in_schema=False, dependencies=KEY)
    api.state.service, api.state.api_key = service, api_key
    api.state.page = importlib.resources.files("cqg_ray.serve").joinpath("static/index.html").read_text(encoding="utf-8")
    api.include_router(router)
    api.add_middleware(RequestLimits, max_body_bytes=service.cfg.max_request_bytes, body_timeout_s=service.cfg.body_timeout_s,
                       max_header_bytes=max_header_bytes)
    api.add_exception_handler(ApiError, _api_error)
    api.add_exception_handler(StarletteHTTPException, _http_error)
    api.add_exception_handler(RequestValidationError, _validation_error)
    api.add_exception_handler(Exception, _server_error)
    return api


@serve.deployment(name="EmbedderServer")
@serve.ingress()
class EmbedderServer(EmbeddingService):
    """One replica: the model and its batch queue, served over HTTP by `build_api` (and callable through a
    DeploymentHandle: `handle.embed.remote(EmbedRequest(...))`)."""

    def __init__(self, model_path: str, serve_cfg: dict):
        import torch

        from cqg_ray.mbqa.embedder import InterpretableEmbedder

        cfg = ServeConfig.model_validate(serve_cfg)
        if not torch.cuda.is_available():
            torch.set_num_threads(cfg.torch_threads)
        self.api_key = read_api_key(cfg)
        super().__init__(InterpretableEmbedder.load(model_path, backend=cfg.encoder_backend), cfg)

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Ray Serve's hook for an app built in the replica, after __init__."""
        return build_api(self, self.api_key)


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
    return EmbedderServer.options(**deployment_options(cfg, env_vars)).bind(model_path, cfg.model_dump(mode="json"))


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

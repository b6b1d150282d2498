"""Any OpenAI-compatible chat endpoint (vLLM serve, llama.cpp server, Ray Serve LLM, ...) over httpx.

    llm = LLMConfig(backend="openai", openai=OpenAIConfig(base_url="http://127.0.0.1:8000/v1", model="local"))
    with OpenAIBackend(llm) as b:
        outs = b.complete(requests)

- No key unless ``OpenAIConfig.api_key_env`` names an environment variable (then it must be set).
- At most ``max_concurrency`` requests in flight (a thread pool sharing one connection pool).
- Every HTTP call has ``timeout_s``; 429, 5xx and connection errors (refused, reset, timed out) are retried
  ``max_retries`` times with exponential backoff (``backoff_s * 2**k``, at most 60 s, at least a numeric
  ``Retry-After``); after that the backend raises ``BackendError`` (the runner has kept what finished).
- 401, 403, 404 and 405 say the setup is wrong (key, model name, URL): ``OpenAIError`` at once, with the
  server's message, and the stage stops. Any other 4xx (400, 413, 422: this one prompt is too long or
  malformed) is this request's error: it comes back as a ``Completion`` with ``error`` set and ``final``, so
  the runner records it as failed at once, with the server's message, and the stage goes on. ``FATAL_4XX_IN_A_ROW`` such errors
  with no success between them mean the endpoint refuses everything: ``OpenAIError``.
- A 200 whose body is not a chat completion comes back as a ``Completion`` with ``error`` set (the runner
  retries it like an unreadable answer).
- A question list (``Request.stop_on_loop``) is streamed (``stream: true``, usage asked with ``stream_options``) and the
  stream closed at the newline where the list loops (``parse.loops``), as the embedded engines stop it (the server,
  vLLM's included, aborts a request whose client went away); its tokens are the server's usage where it sends one,
  else the content chunks counted, and the prompt's from the server's ``/tokenize`` (vLLM; 0 without it); a stream
  that stops before its end (no finish_reason, no [DONE]) or that carries an error event (vLLM's way to fail a request
  after its 200) is that request's error, asked again; a JSON reply to it is read as one. ``OpenAIConfig.stop_loops:
  false`` asks as any other.
- Constrained answers: ``send_grammar`` adds a llama.cpp GBNF ``grammar``; ``send_structured_outputs`` adds
  vLLM's ``structured_outputs: {regex: ...}``; ``extra_body`` is merged into every request body.
- With ``LLMConfig.logprobs``, answer requests ask for ``logprobs`` + ``top_logprobs=5`` and P(yes) per line
  is read from them. A single-pass request (``yes_no``) asks for one token with ``top_logprobs=20`` and P(yes)
  is read from that position (servers that return no logprobs make it an error); the server's prefix cache
  (vLLM's, llama.cpp's) reuses the shared text, and ``usage.prompt_tokens_details.cached_tokens`` is counted.
"""

from __future__ import annotations

import json
import math
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import httpx

from cqg_ray.config import LLMConfig
from cqg_ray.llm.base import Backend, BackendError, Completion, Request, answer_gbnf, answer_regex
from cqg_ray.llm.parse import loops, p_yes_from_tokens, p_yes_from_top

MAX_BACKOFF_S = 60.0
TOP_LOGPROBS = 5
TOP_LOGPROBS_SINGLE = 20  # single-pass: the yes and no spellings must both be among the first token's alternatives
SETUP_ERRORS = (401, 403, 404, 405)  # wrong key, model or URL: every request would fail the same way
FATAL_4XX_IN_A_ROW = 32  # requests refused in a row (prompts about one long text come together)


class OpenAIError(BackendError):
    """The endpoint refused a request with a 4xx other than 429 (not retried)."""


def chat_body(llm: LLMConfig, req: Request, temperature: float) -> dict[str, Any]:
    """The JSON body of one /chat/completions call (pure; unit-tested)."""
    cfg = llm.openai
    body: dict[str, Any] = {
        "model": cfg.model,
        "messages": req.messages,
        "max_tokens": req.max_tokens,
        "temperature": temperature,
    }
    if req.seed is not None:
        body["seed"] = req.seed
    if req.yes_no:  # single-pass: one token, P(yes) from its top logprobs
        body.update({"max_tokens": 1, "logprobs": True, "top_logprobs": TOP_LOGPROBS_SINGLE})
        if req.answer_prefix:  # the reply's start as a final assistant message, continued (vLLM's chat parameters)
            body["messages"] = [*req.messages, {"role": "assistant", "content": req.answer_prefix}]
            body.update({"continue_final_message": True, "add_generation_prompt": False})
    if llm.logprobs and req.n_answers is not None:
        body["logprobs"] = True
        body["top_logprobs"] = TOP_LOGPROBS
    if llm.constrained and req.n_answers is not None:
        if cfg.send_grammar:
            body["grammar"] = answer_gbnf(req.n_answers)
        if cfg.send_structured_outputs:
            body["structured_outputs"] = {"regex": answer_regex(req.n_answers)}
    body.update(cfg.extra_body)
    return body


def _logprob(value: Any) -> float:
    """A logprob as a float <= 0 (a server's rounding above 0 is 0); not a number is a ValueError."""
    v = float(value)
    if math.isnan(v):
        raise ValueError("a logprob is NaN")
    return min(v, 0.0)


def tokens_from_openai_logprobs(logprobs: dict[str, Any] | None) -> list[tuple[str, float, dict[str, float]]]:
    """OpenAI chat ``logprobs`` ({"content": [{token, logprob, top_logprobs: [...]}, ...]}) -> p_yes_from_tokens input.
    A body of another shape raises (TypeError, KeyError, ValueError, AttributeError): ``completion_from_json`` marks it."""
    out = []
    for item in (logprobs or {}).get("content") or []:
        alts = {str(a["token"]): _logprob(a["logprob"]) for a in item.get("top_logprobs") or [] if a.get("logprob") is not None}
        out.append((str(item.get("token", "")), _logprob(item["logprob"]) if item.get("logprob") is not None else float("-inf"), alts))
    return out


def completion_from_json(data: Any, req: Request, want_p_yes: bool) -> Completion:
    """A ``Completion`` from a chat completion response body; ``error`` set when it is not one (any part of it of
    another shape: the one request fails, not the stage)."""
    try:
        return _completion(data, req, want_p_yes)
    except (KeyError, IndexError, TypeError, AttributeError, ValueError, OverflowError) as e:
        return Completion("", error=f"malformed chat completion ({type(e).__name__}: {e}): {str(data)[:300]}")


def _completion(data: Any, req: Request, want_p_yes: bool) -> Completion:
    choice = data["choices"][0]
    text = choice["message"].get("content") or ""
    if not isinstance(text, str):
        raise TypeError(f"content is {type(text).__name__}, not text")
    usage = data.get("usage") or {}
    cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    if req.yes_no:
        p = p_yes_from_top(tokens_from_openai_logprobs(choice.get("logprobs")))
        if p is None:
            return Completion(text, prompt, completion, error=f"single-pass answer without yes/no logprobs (does the server return "
                                                              f"top_logprobs?): {str(choice.get('logprobs'))[:300]}", cached_tokens=cached)
        return Completion(text, prompt, completion, [p], cached_tokens=cached)
    p_yes = None
    if want_p_yes and req.n_answers is not None and choice.get("logprobs"):
        tokens = tokens_from_openai_logprobs(choice["logprobs"])
        if tokens:
            p_yes = p_yes_from_tokens(tokens, req.n_answers)
    return Completion(text, prompt, completion, p_yes, cached_tokens=cached)


def sse_data(lines: Iterable[str]) -> Iterator[Any]:
    """The JSON of each ``data:`` line of a server-sent event stream; None for ``data: [DONE]``, its end."""
    for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        payload = line[5:].strip()
        if payload == "[DONE]":
            yield None
            return
        yield json.loads(payload)


def streamed_completion(events: Iterable[Any]) -> Completion:
    """A ``Completion`` from a streamed chat completion's chunks, read until the content loops (``parse.loops``, checked
    at each newline) or the stream ends; tokens from its usage chunk where one came before that, else the content
    chunks counted. ``error`` set when a chunk is not a chat completion chunk, when the stream stopped before its
    end (no finish_reason, no [DONE]), or when an event is an error (vLLM's server sends one, then [DONE], when its
    engine fails after the 200): the runner asks again."""
    text, chunks, usage, ended = "", 0, None, False
    try:
        for event in events:
            if event is None:  # [DONE]
                ended = True
                break
            if event.get("error") is not None:  # vLLM's server, its engine failing after the 200: this event, then [DONE]
                return Completion("", error=f"the server reported an error in the stream after {chunks} chunks: {json.dumps(event['error'])[:500]}")
            usage = event.get("usage") or usage
            for choice in event.get("choices") or []:
                ended = ended or choice.get("finish_reason") is not None
                piece = (choice.get("delta") or {}).get("content") or ""
                if not isinstance(piece, str):
                    raise TypeError(f"content is {type(piece).__name__}, not text")
                text, chunks = text + piece, chunks + bool(piece)
                if "\n" in piece and loops(text):
                    return Completion(text, 0, chunks)
    except (ValueError, TypeError, AttributeError) as e:  # json.JSONDecodeError is a ValueError
        return Completion("", error=f"malformed chat completion stream ({type(e).__name__}: {e})")
    if not ended:
        return Completion("", error=f"the stream stopped before its end (no finish_reason, no [DONE]) after {chunks} chunks")
    if usage:
        return Completion(text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or chunks))
    return Completion(text, 0, chunks)


def backoff_delay(attempt: int, base_s: float, retry_after: str | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): base * 2**attempt, capped, >= Retry-After."""
    delay = min(base_s * (2**attempt), MAX_BACKOFF_S)
    if retry_after:
        try:
            delay = max(delay, min(float(retry_after), MAX_BACKOFF_S))
        except ValueError:
            pass  # an HTTP date: keep our own backoff
    return delay


def _headers(llm: LLMConfig) -> dict[str, str]:
    key = os.environ.get(llm.openai.api_key_env) if llm.openai.api_key_env else None
    return {"Authorization": f"Bearer {key}"} if key else {}


def _server_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def server_context(llm: LLMConfig) -> int | None:
    """The served model's context length, where the server says it (vLLM: ``max_model_len`` in /v1/models); else None."""
    cfg = llm.openai
    try:
        r = httpx.get(cfg.base_url.rstrip("/") + "/models", headers=_headers(llm), timeout=min(cfg.timeout_s, 10.0))
        models = r.json().get("data", []) if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    for m in models:
        if isinstance(m, dict) and m.get("id") == cfg.model and isinstance(m.get("max_model_len"), int):
            return int(m["max_model_len"])
    lens = [m.get("max_model_len") for m in models if isinstance(m, dict) and isinstance(m.get("max_model_len"), int)]
    return int(lens[0]) if len(lens) == 1 else None


def server_count(llm: LLMConfig, req: Request) -> int | None:
    """The prompt's tokens as the server counts them (vLLM's ``POST /tokenize`` with the chat messages); None where the
    server has no such route."""
    cfg = llm.openai
    body = {"model": cfg.model, "messages": req.messages, "add_generation_prompt": True}
    try:
        r = httpx.post(_server_root(cfg.base_url) + "/tokenize", json=body, headers=_headers(llm), timeout=min(cfg.timeout_s, 30.0))
        count = r.json().get("count") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(count, int):
        return None
    return count + (len(req.answer_prefix) if req.answer_prefix else 0)  # the reply's start: at most a token a character


class OpenAIBackend(Backend):
    name = "openai"

    def prompt_budget(self):
        return openai_budget(self.llm)

    def __init__(self, llm: LLMConfig, sleep: Callable[[float], None] = time.sleep, transport: httpx.BaseTransport | None = None):
        super().__init__(llm)
        cfg = llm.openai
        headers = {}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise BackendError(f"openai.api_key_env={cfg.api_key_env!r} but that environment variable is not set")
            headers["Authorization"] = f"Bearer {key}"
        self.url = cfg.base_url.rstrip("/") + "/chat/completions"
        self.client = httpx.Client(
            timeout=httpx.Timeout(cfg.timeout_s),
            limits=httpx.Limits(max_connections=cfg.max_concurrency, max_keepalive_connections=cfg.max_concurrency),
            headers=headers,
            transport=transport,
        )
        self.pool = ThreadPoolExecutor(cfg.max_concurrency, thread_name_prefix="cqg-openai")
        self.sleep = sleep
        self.http_calls = 0  # every POST made, retries included
        self.http_retries = 0
        self.http_request_errors = 0  # 4xx answered for one request (recorded as that request's error)
        self._4xx_in_a_row = 0
        self._fatal: str | None = None  # once set, every request queued behind it fails without being sent
        self._no_tokenize = False  # the server answered no /tokenize: a list closed at its loop keeps 0 prompt tokens

    def counters(self) -> dict[str, int]:
        return {"http_calls": self.http_calls, "http_retries": self.http_retries, "http_request_errors": self.http_request_errors}

    def complete_one(self, req: Request) -> Completion:
        # Our own retry loop, not the `openai` client's: the client's backoff is fixed (0.5 s doubling to 8 s, random
        # jitter, no `backoff_s`), a Retry-After replaces it instead of being a floor, and it counts no retries, while
        # tests/llm/test_openai.py pins the sleeps and the http_calls / http_retries counters exactly.
        cfg = self.llm.openai
        if self._fatal:
            raise OpenAIError(self._fatal)
        body = chat_body(self.llm, req, self.temperature(req))
        stream = req.stop_on_loop and cfg.stop_loops
        if stream:
            body.update({"stream": True, "stream_options": {"include_usage": True}})
        last = ""
        for attempt in range(cfg.max_retries + 1):
            retry_after = None
            self.http_calls += 1
            try:
                if stream:
                    streamed = None
                    with self.client.stream("POST", self.url, json=body) as r:
                        if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
                            self._4xx_in_a_row = 0
                            streamed = streamed_completion(sse_data(r.iter_lines()))  # leaving the block closes the stream
                        else:
                            r.read()  # an error's body, or one JSON reply from a server that does not stream: handled below
                    if streamed is not None:
                        return self.prompt_counted(streamed, req)
                else:
                    r = self.client.post(self.url, json=body)
            except httpx.TransportError as e:  # refused, reset, timed out, protocol error
                last = f"{type(e).__name__}: {e}"
            else:
                if r.status_code == 200:
                    self._4xx_in_a_row = 0
                    try:
                        data = r.json()
                    except ValueError:
                        return Completion("", error=f"response is not JSON: {r.text[:300]}")
                    return completion_from_json(data, req, self.llm.logprobs)
                if r.status_code == 429 or r.status_code >= 500:
                    last = f"HTTP {r.status_code}: {r.text[:300]}"
                    retry_after = r.headers.get("retry-after")
                elif r.status_code in SETUP_ERRORS:
                    self._fatal = f"{self.url} refused the request with HTTP {r.status_code} (check base_url, model and api_key_env): {r.text[:1000]}"
                    raise OpenAIError(self._fatal)
                else:
                    self.http_request_errors += 1
                    self._4xx_in_a_row += 1
                    if self._4xx_in_a_row >= FATAL_4XX_IN_A_ROW:
                        self._fatal = f"{self.url} refused {self._4xx_in_a_row} requests in a row; the last with HTTP {r.status_code}: {r.text[:1000]}"
                        raise OpenAIError(self._fatal)
                    return Completion("", error=f"HTTP {r.status_code} (this request was refused): {r.text[:1000]}", final=True)
            if attempt == cfg.max_retries:
                break
            self.http_retries += 1
            self.sleep(backoff_delay(attempt, cfg.backoff_s, retry_after))
        raise BackendError(f"{self.url}: no answer after {cfg.max_retries + 1} tries; last error: {last}")

    def prompt_counted(self, c: Completion, req: Request) -> Completion:
        """A streamed reply closed at its loop, before the usage chunk: its prompt tokens from the server's /tokenize
        (vLLM), asked once more; left 0 on a server without it (not asked again)."""
        if c.error is not None or c.prompt_tokens or self._no_tokenize:
            return c
        n = server_count(self.llm, req)
        self._no_tokenize = n is None
        return c if n is None else replace(c, prompt_tokens=n)

    def complete(self, requests: Sequence[Request]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        for i, c in self.stream(requests):
            out[i] = c
        return out  # type: ignore[return-value]

    def stream(self, requests: Sequence[Request]) -> Iterator[tuple[int, Completion]]:
        """Results as they finish, with at most ``2 * max_concurrency`` requests queued at a time."""
        window = 2 * self.llm.openai.max_concurrency
        todo = iter(range(len(requests)))
        futures: dict[Future, int] = {}

        def fill() -> None:
            while len(futures) < window:
                i = next(todo, None)
                if i is None:
                    return
                futures[self.pool.submit(self.complete_one, requests[i])] = i

        try:
            fill()
            while futures:
                finished, _ = wait(list(futures), return_when=FIRST_COMPLETED)
                for f in finished:
                    i = futures.pop(f)
                    yield i, f.result()
                fill()
        finally:
            for f in futures:
                f.cancel()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def openai_budget(llm: LLMConfig) -> Any:
    """An OpenAI-compatible server: its context from the config or the server (vLLM's /v1/models), its tokens from
    the server's /tokenize (vLLM), else from ``openai.tokenizer``, else the byte bound. None when the context is unknown."""
    from cqg_ray.llm.fit import PromptBudget, byte_budget, hf_budget, template_overhead

    cfg = llm.openai
    context = cfg.max_model_len or server_context(llm)
    if context is None:
        return None
    engine = f"OpenAI-compatible server {cfg.base_url}"
    if cfg.tokenizer:
        return hf_budget(cfg.tokenizer, context, engine)
    probe = Request([{"role": "user", "content": "x"}], max_tokens=1)
    if server_count(llm, probe) is not None:
        by_bytes = byte_budget(context, engine).count

        def count(req: Request) -> int:
            n = server_count(llm, req)
            return n if n is not None else by_bytes(req)

        return PromptBudget(context, count, f"{engine} /tokenize", overhead=template_overhead(count))
    return byte_budget(context, engine)

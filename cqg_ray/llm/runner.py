"""Run a list of LLM requests through the ledger: resume, group by shared prefix, retry, account.

    results = run_requests(requests, cfg.llm, run, stage="labels")
    results[i].answers      # list[bool] for an answer request that parsed; None otherwise
    results[i].text, .ok, .error, .p_yes, .prompt_tokens, .completion_tokens, .attempts, .cached, .meta

What it does, in order:
1. keys every request (``ledger.request_key``) and reads the key and accounting columns of the stage's ledger (never
   the results of other calls); keys already there are not sent again (a failed key neither, unless
   ``retry_failed=True`` or ``llm.retry_failed``); identical requests are sent once;
2. sorts the rest by prompt so prompts sharing a prefix (the same text chunk) run one after another
   (llama.cpp keeps the shared prefix in its KV cache, or evaluates it once for a batch of single-pass
   questions; vLLM's prefix caching does the same across a batch);
3. streams them through the backend; a single-pass request (``yes_no``) is answered ``p_yes > 0.5`` and is
   not asked again unless the backend failed (the same prompt gives the same logits); a packed answer request (``n_answers``) whose reply does not parse, or a
   request the backend failed, is asked again, up to ``LLMConfig.max_attempts`` in all; attempts after the
   first sample at temperature ``RETRY_TEMPERATURE`` (seed = attempt number), since at temperature 0 the
   same prompt gives the same reply; a request still unreadable after the last attempt is recorded as
   failed (``ok=False``) with its raw text;
4. journals each finished row the moment it finishes (``Ledger.record``) and writes a Parquet shard every
   ``LLMConfig.flush_every`` results or ``LLMConfig.flush_s`` seconds, at the end, and on any exception before it
   propagates: a kill -9 loses only the requests in flight (object stores have no journal: there it also loses the
   rows since the last shard);
5. writes the stage's accounting to ``llm/ledger/<stage>/_stats.json`` (at every flush and at the end);
6. reads back the full rows of this call's own keys only (``Ledger.rows``).

``answer_pending`` (step 3) is also what the workers of streaming stages (``cqg_ray.mbqa.label``) run.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pyarrow.compute as pc

from cqg_ray.config import LLMConfig
from cqg_ray.llm.backends import make_backend
from cqg_ray.llm.base import Backend, BackendError, Completion, Request, backend_identity
from cqg_ray.llm.ledger import ACCOUNTING, BatchWriter, Ledger, latest, request_key, row_counts, table_totals
from cqg_ray.llm.parse import ParseError, parse_answers
from cqg_ray.progress import View
from cqg_ray.progress import add as add_progress
from cqg_ray.rundir import RunDir

log = logging.getLogger("cqg_ray")

RETRY_TEMPERATURE = 0.7
MAX_RUNS_KEPT = 100  # per-run entries kept in _stats.json (totals always cover the whole ledger)


@dataclass
class LLMResult:
    key: str
    text: str
    ok: bool
    answers: list[bool] | None = None  # parsed yes/no answers (answer requests that parsed)
    p_yes: list[float | None] | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    cached: bool = False  # read from the ledger: no call was made for it in this run
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Pending:
    key: str
    request: Request
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    text: str = ""
    error: str | None = None


def _prefix_order(req: Request) -> str:
    return "\x00".join(f"{m['role']}\x01{m['content']}" for m in req.messages)


def _finish(p: _Pending, ok: bool, answers: list[bool] | None, p_yes: list[float | None] | None) -> dict[str, Any]:
    return {
        "key": p.key,
        "text": p.text,
        "ok": ok,
        "error": p.error,
        "answers": answers,
        "p_yes": p_yes,
        "prompt_tokens": p.prompt_tokens,
        "completion_tokens": p.completion_tokens,
        "attempts": p.attempts,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def judge(req: Request, c: Completion) -> tuple[bool, list[bool] | None, str | None]:
    """(accepted, answers, error) for one completion of one request."""
    if c.error:
        return False, None, c.error
    if req.yes_no:
        if not c.p_yes or len(c.p_yes) != 1 or c.p_yes[0] is None or not 0.0 <= c.p_yes[0] <= 1.0:
            return False, None, f"single-pass answer without a P(yes): {c.p_yes!r}"
        return True, [c.p_yes[0] > 0.5], None
    if req.n_answers is None:
        return True, None, None
    try:
        return True, parse_answers(c.text, req.n_answers), None
    except ParseError as e:
        return False, None, f"unparseable: {e}"


def settled(req: Request, c: Completion, ok: bool, attempt: int, max_attempts: int) -> bool:
    """Whether a judged completion is final: accepted, the last attempt, a reply the backend marks final, or a
    single-pass answer the backend gave (the same prompt gives the same logits, so asking again cannot change it)."""
    return ok or attempt >= max_attempts or c.final or (req.yes_no and not c.error)


def new_run_stats(t0: float, requests: int, unique: int, from_ledger: int, to_send: int) -> dict[str, Any]:
    """One run's entry of ``_stats.json`` (counters start at zero)."""
    return {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "requests": requests,
        "unique": unique,
        "from_ledger": from_ledger,
        "to_send": to_send,
        "sent": 0,
        "finished": 0,
        "failures": 0,
        "retries": 0,
        "prompt_tokens": 0,
        "cached_prompt_tokens": 0,
        "completion_tokens": 0,
        "wall_s": 0.0,
        "complete": False,
    }


def answer_pending(pending: list[_Pending], backend: Backend, llm: LLMConfig, stage: str, on_row: Callable[[dict[str, Any]], None],
                   this_run: dict[str, Any]) -> None:
    """Send ``pending`` through ``backend`` with the retry rules of the module docstring; ``on_row(row)`` gets each
    finished ledger row the moment it is judged; ``this_run``'s counters are updated, and ``progress``'s ``finished``
    for each. Used by ``run_requests`` and by the workers of streaming stages."""
    for attempt in range(1, llm.max_attempts + 1):
        if not pending:
            break
        if attempt > 1:
            this_run["retries"] += len(pending)
            log.info("llm %s: attempt %d for %d requests", stage, attempt, len(pending))
        sent = [p.request if attempt == 1 else dataclasses.replace(p.request, temperature=max(llm.temperature, RETRY_TEMPERATURE), seed=attempt)
                for p in pending]
        again: list[_Pending] = []
        received: set[int] = set()
        for i, c in backend.stream(sent):
            if i in received:
                continue
            received.add(i)
            p = pending[i]
            p.attempts += 1
            p.prompt_tokens += c.prompt_tokens
            p.completion_tokens += c.completion_tokens
            p.text = c.text
            this_run["sent"] += 1
            this_run["prompt_tokens"] += c.prompt_tokens
            this_run["cached_prompt_tokens"] += c.cached_tokens
            this_run["completion_tokens"] += c.completion_tokens
            ok, answers, error = judge(p.request, c)
            p.error = error
            if settled(p.request, c, ok, attempt, llm.max_attempts):
                this_run["finished"] += 1
                this_run["failures"] += 0 if ok else 1
                if not ok:
                    log.warning("llm %s: request failed after %d attempts: %s", stage, p.attempts, error)
                on_row(_finish(p, ok, answers, c.p_yes if ok else None))  # journalled there: a kill from here on cannot lose it
                add_progress(finished=1)
            else:
                again.append(p)
        if len(received) != len(pending):
            raise BackendError(f"{type(backend).__name__} returned no result for {len(pending) - len(received)} of {len(pending)} requests")
        pending = again


def generation_prior(requests) -> float:
    """Tokens a request is expected to generate before any has finished (``Request.expected_tokens``, the mean of the
    ones given)."""
    want = [r.expected_tokens for r in requests]
    return sum(want) / len(want) if want else 0.0


def run_requests(
    requests: Sequence[Request],
    llm: LLMConfig,
    run: RunDir,
    stage: str,
    progress: bool = True,
    backend: Backend | None = None,
    retry_failed: bool = False,
) -> list[LLMResult]:
    """Results for ALL ``requests`` (from the ledger or new), aligned with the input order. See module docstring.
    ``progress``: show the requests finished, tokens read and generated, and the time left as they advance."""
    t0 = time.time()
    for r in requests:
        r.validate()
    owns_backend = backend is None
    if backend is not None and backend.llm is not llm and backend.identity != backend_identity(llm):
        raise ValueError(f"backend identity {backend.identity} does not match the LLM config {backend_identity(llm)}")
    identity = backend.identity if backend is not None else backend_identity(llm)
    keys = [request_key(identity, r, llm.logprobs) for r in requests]
    ledger = Ledger(run, stage)
    recovered = ledger.recover()  # rows killed runs journalled but never put in a shard
    if recovered:
        log.info("llm %s: %d finished requests recovered from the journal of an interrupted run", stage, recovered)
    have = latest(ledger.columns(ACCOUNTING))  # the keys and their accounting only, never the results
    retry = retry_failed or llm.retry_failed
    ok = have.column("ok").to_pylist()
    done = {k for k, good in zip(have.column("key").to_pylist(), ok) if good or not retry}
    asked_again = {r["key"]: row_counts(r) for r in have.filter(pc.invert(have.column("ok"))).to_pylist()} if retry else {}  # failed, sent again
    todo: dict[str, _Pending] = {}
    for k, r in zip(keys, requests):
        if k not in done and k not in todo:
            todo[k] = _Pending(k, r)
    pending = sorted(todo.values(), key=lambda p: _prefix_order(p.request))
    from_ledger = sum(1 for k in set(keys) if k in done)
    log.info("llm %s: %d requests, %d unique, %d from the ledger, %d to send", stage, len(requests), len(set(keys)), from_ledger, len(pending))

    stats = ledger.read_stats()
    wall_before = float(stats.get("totals", {}).get("wall_s", 0.0))
    this_run = new_run_stats(t0, len(requests), len(set(keys)), from_ledger, len(pending))
    stats["runs"] = [*stats.get("runs", [])[-(MAX_RUNS_KEPT - 1) :], this_run]
    stats.update({"stage": stage, "model": identity})
    running = table_totals(have)
    fresh: dict[str, dict[str, Any]] = {}  # the rows finished by this run

    complete = False  # set once every request is answered: the last flush's stats say so

    def account(rows: list[dict[str, Any]]) -> None:
        for row in rows:
            for k, v in asked_again.pop(row["key"], {}).items():  # a failed row asked again (retry_failed)
                running[k] -= v
            for k, v in row_counts(row).items():
                running[k] += v
        this_run["wall_s"] = round(time.time() - t0, 3)
        this_run["complete"] = complete
        if backend is not None:  # e.g. HTTP calls and retries of the OpenAI backend, this run's share only
            this_run.update({k: v - counters_before.get(k, 0) for k, v in backend.counters().items()})
        if this_run["wall_s"] > 0:
            this_run["requests_per_s"] = round(this_run["sent"] / this_run["wall_s"], 3)
            this_run["completion_tokens_per_s"] = round(this_run["completion_tokens"] / this_run["wall_s"], 3)
        stats["totals"] = {**running, "wall_s": round(wall_before + this_run["wall_s"], 3)}
        ledger.write_stats(stats)

    writer = BatchWriter(ledger, llm.flush_every, llm.flush_s, on_flush=account)

    def on_row(row: dict[str, Any]) -> None:
        fresh[row["key"]] = row
        writer.add(row)

    ledger.write_stats(stats)  # the run's entry (to_send) from its start: `cqg-ray status` reads it
    if owns_backend and pending:
        backend = make_backend(llm)
    counters_before = backend.counters() if backend is not None else {}  # a backend given in may have served other runs
    view = View(f"llm {stage}", "req", len(pending), run=run, stage=stage, show=progress and bool(pending),
                         remote=bool(pending) and getattr(backend, "remote_engines", False), gen_per_request=generation_prior(p.request for p in pending))
    try:
        with view:
            answer_pending(pending, backend, llm, stage, on_row, this_run)  # type: ignore[arg-type]
        complete = True
    finally:
        writer.flush()  # keep what finished, even when the backend raised
        ledger.close()
        if owns_backend and backend is not None:
            backend.close()
    ledger.compact()

    old = ledger.rows(k for k in set(keys) if k not in fresh)  # the results of this call's own keys, nothing else
    out = []
    for k, r in zip(keys, requests):
        row = fresh.get(k) or old[k]
        out.append(
            LLMResult(
                key=k,
                text=row["text"] or "",
                ok=bool(row["ok"]),
                answers=row["answers"],
                p_yes=row["p_yes"],
                error=row["error"],
                prompt_tokens=int(row["prompt_tokens"] or 0),
                completion_tokens=int(row["completion_tokens"] or 0),
                attempts=int(row["attempts"] or 0),
                cached=k not in todo,
                meta=r.meta,
            )
        )
    log.info(
        "llm %s: done in %.1fs: %d sent, %d failures, %d retries, %d prompt + %d completion tokens",
        stage, this_run["wall_s"], this_run["sent"], this_run["failures"], this_run["retries"], this_run["prompt_tokens"], this_run["completion_tokens"],
    )
    return out


def stage_stats(run: RunDir, stage: str) -> dict[str, Any]:
    """The accounting JSON of one stage's ledger ({} totals when the stage never ran)."""
    return Ledger(run, stage).read_stats()


def answers_table(results: Sequence[LLMResult]) -> list[dict[str, Any]]:
    """Flatten answer results to one row per (request, question): meta fields + question index + answer + p_yes.

    A convenience for labelling stages: ``meta`` should hold per-request fields (e.g. doc_id) and may hold
    ``question_ids`` (a list, one per answer line); failed requests are skipped.
    """
    rows = []
    for r in results:
        if not r.ok or r.answers is None:
            continue
        qids = r.meta.get("question_ids")
        base = {k: v for k, v in r.meta.items() if k != "question_ids"}
        for j, a in enumerate(r.answers):
            row = {**base, "line": j, "answer": a}
            if qids is not None:
                row["question_id"] = qids[j]
            if r.p_yes is not None:
                row["p_yes"] = r.p_yes[j]
            rows.append(row)
    return rows


__all__ = ["LLMResult", "run_requests", "stage_stats", "answers_table", "judge", "RETRY_TEMPERATURE"]

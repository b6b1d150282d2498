"""Live progress of long stages: counters the work advances where it runs, and one view of them in the driver.

    progress.add(read=412, read_s=1.9)        # an engine read 412 prompt tokens in 1.9 s (any process, any thread)
    with progress.View("llm labels", "req", total=2817, kind="llm", run=run, stage="labels") as view:
        ...                                   # Ray workers call progress.relay(view.queue) (queue(): the live one)

Counters (per process, only ever growing): ``finished`` requests, ``handed`` requests given to an engine and the prompt
tokens ``planned`` for them (what the engine will compute: a prefix tree's shared tokens count once), prompt tokens
``read`` and tokens ``generated`` with the seconds spent on each (``read_s``, ``generate_s``), ``texts`` encoded.
A Ray worker's counters reach the driver through a Ray queue: ``relay`` starts a thread that puts what advanced every
``RELAY_S`` seconds. The view shows a tqdm bar where stderr is a terminal or in a Jupyter notebook (``in_notebook``:
``tqdm.auto``'s widget where ipywidgets is installed, its text bar otherwise), else one log line every ``every_s`` seconds
(25 by default, ``CQG_RAY_PROGRESS_EVERY_S``: never more than 30 s of silence): what ``ray job submit`` logs show. It also writes the line to the run
directory's ``_progress.json``, which ``cqg-ray status`` reads. ``CQG_RAY_PROGRESS=0`` turns bars and lines off.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from typing import Any

from cqg_ray.env import env_seconds

log = logging.getLogger("cqg_ray")

NAMES = ("finished", "handed", "planned", "read", "read_s", "generated", "generate_s", "texts", "epochs")
COUNTER = {"llm": "finished", "texts": "texts", "epochs": "epochs"}  # what a view's bar counts, by kind
RELAY_S = 2.0
PROGRESS_FILE = "_progress.json"

_lock = threading.Lock()
_counts: dict[str, float] = dict.fromkeys(NAMES, 0)
_relay: dict[str, Any] = {"queue": None, "sent": None, "thread": None}
_live: list["View"] = []  # the views open in this process, innermost last


def add(**amounts: float) -> None:
    """Advance this process's counters (names from ``NAMES``)."""
    with _lock:
        for k, v in amounts.items():
            _counts[k] += v


def snapshot() -> dict[str, float]:
    with _lock:
        return dict(_counts)


def _minus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a[k] - b.get(k, 0) for k in a}


def relay(queue: Any) -> None:
    """Send this process's counters from now on to ``queue`` (a ``ray.util.queue.Queue`` a driver's view drains), every
    ``RELAY_S`` seconds while they advance; None stops sending. A worker calls it once per stage (idempotent)."""
    with _lock:
        if _relay["queue"] is queue:
            return
        _relay["queue"], _relay["sent"] = queue, dict(_counts)
        if queue is not None and _relay["thread"] is None:
            _relay["thread"] = threading.Thread(target=_relay_loop, name="cqg-ray-progress", daemon=True)
            _relay["thread"].start()


def flush_relay() -> None:
    """Put what advanced since the last send now (a worker at the end of a call)."""
    with _lock:
        q, sent = _relay["queue"], _relay["sent"]
        if q is None:
            return
        now = dict(_counts)
        _relay["sent"] = now
    delta = _minus(now, sent)
    if any(delta.values()):
        try:
            q.put_nowait(delta)
        except Exception:  # a full or closed queue: progress is best effort, never the work's failure
            pass


def _relay_loop() -> None:
    while True:
        time.sleep(RELAY_S)
        flush_relay()


def queue() -> Any:
    """The queue of the innermost live view of this process that has one (for engines started inside it), or None."""
    return next((v.queue for v in reversed(_live) if v.queue is not None), None)


def fmt_count(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else f"{int(n):,}"


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def in_notebook() -> bool:
    """Whether this process is an IPython kernel (Jupyter, VS Code, Colab): its stderr is no terminal, yet it shows a
    bar. Imports nothing: a process that has not imported ipykernel and IPython is none."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        shell = sys.modules["IPython"].get_ipython()
    except Exception:  # no IPython imported, or one without get_ipython
        return False
    return getattr(shell, "kernel", None) is not None  # a terminal IPython's shell has no kernel


GENERATE_COST = 4.0  # a generated token's time in prompt tokens', before any is generated (CPU engines, batched decoding)


def llm_eta(c: dict[str, float], total: float, gen_per_request: float, wall_s: float) -> float | None:
    """Seconds left of an LLM stage from its counters (None until something advanced).

    Prompt tokens left: the handed requests' planned tokens not read yet, plus the requests not handed yet at the
    handed ones' mean. Tokens left to generate: ``gen_per_request`` for every request, less what was generated; once
    requests finish, the mean a request in place of the prior, the tokens generated counted over the finished requests
    and half of those handed and still running (a batch's first reply to end, the others half written, is no mean
    of 1,000 tokens). Each costs what it has cost so far (``read_s / read``,
    ``generate_s / generated``; before the first, ``GENERATE_COST`` prompt tokens); engines working side by side divide
    it (the seconds they spent over the wall time)."""
    if c["finished"] >= total:
        return 0.0
    if not c["read"] and not c["generated"] and not c["finished"]:
        return None
    per_read = c["read_s"] / c["read"] if c["read"] else 0.0
    per_gen = c["generate_s"] / c["generated"] if c["generated"] else None
    planned_per = c["planned"] / c["handed"] if c["handed"] else 0.0
    read_left = max(0.0, c["planned"] - c["read"]) + planned_per * max(0.0, total - c["handed"])
    running = max(0.0, c["handed"] - c["finished"])
    gen = c["generated"] / (c["finished"] + running / 2) if c["finished"] and c["generated"] else gen_per_request
    gen_left = max(0.0, gen * total - c["generated"])
    if gen_left and per_gen is None:  # nothing generated yet: a token at GENERATE_COST prompt tokens' time
        per_gen = GENERATE_COST * per_read
    busy = c["read_s"] + c["generate_s"]
    engines = max(1.0, busy / wall_s) if wall_s > 0 and busy > 0 else 1.0
    left = (read_left * per_read + gen_left * (per_gen or 0.0)) / engines
    if not busy and c["finished"]:  # engines that report no tokens (a server): by requests alone
        left = wall_s / c["finished"] * max(0.0, total - c["finished"])
    return left


class View:
    """The driver's view of a stage's progress (see the module docstring). ``kind``: "llm" (requests, with prompt
    tokens read and generated), "texts" or "epochs". ``remote``: also drain a Ray queue the workers relay to (made here
    when Ray runs, unless CQG_RAY_PROGRESS=0). ``run`` and ``stage``: where ``_progress.json`` goes (also when not shown)."""

    def __init__(self, desc: str, unit: str, total: int, kind: str = "llm", run: Any = None, stage: str | None = None,
                 remote: bool = False, gen_per_request: float = 0.0, every_s: float | None = None, show: bool = True):
        self.desc, self.unit, self.total, self.kind = desc, unit, total, kind
        self.run, self.stage, self.gen_per_request = run, stage, gen_per_request
        self.every_s = env_seconds("CQG_RAY_PROGRESS_EVERY_S", 25) if every_s is None else every_s
        self.show = show and os.environ.get("CQG_RAY_PROGRESS", "1") != "0"
        self.queue: Any = None
        if remote and os.environ.get("CQG_RAY_PROGRESS", "1") != "0":  # a queue actor costs a process: not where progress is off
            import ray

            if ray.is_initialized():
                from ray.util.queue import Queue

                self.queue = Queue(maxsize=100_000, actor_options={"num_cpus": 0})
        self.initial = 0  # done before this view opened (a resumed run's epochs): shown, not counted in rates
        self.floor = 0  # done for certain by what the driver saw finish (whole units), whatever the counters say
        self.note = ""  # appended to the line (e.g. the last loss)
        self.remote_counts: dict[str, float] = dict.fromkeys(NAMES, 0)
        self.base = snapshot()
        self.t0 = time.time()
        self.bar: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file_at = 0.0

    # --------------------------------------------------------------------------------------------- reading

    def counts(self) -> dict[str, float]:
        """What advanced since the view opened: this process's counters and what the workers relayed."""
        if self.queue is not None:
            try:
                n = self.queue.qsize()
                for delta in self.queue.get_nowait_batch(n) if n else []:
                    for k, v in delta.items():
                        self.remote_counts[k] = self.remote_counts.get(k, 0) + v
            except Exception:  # the queue actor went away: keep what arrived
                pass
        here = _minus(snapshot(), self.base)
        return {k: here[k] + self.remote_counts.get(k, 0) for k in NAMES}

    def done(self, c: dict[str, float]) -> float:
        return max(self.floor, self.initial + c[COUNTER[self.kind]])

    def eta(self, c: dict[str, float], wall_s: float) -> float | None:
        if self.kind == "llm":
            return llm_eta(c, self.total - self.initial, self.gen_per_request, wall_s)
        now = c[COUNTER[self.kind]]
        return wall_s / now * max(0, self.total - self.done(c)) if now else None

    def line(self, c: dict[str, float] | None = None) -> tuple[str, float | None]:
        """The progress line (without the description) and the seconds left."""
        c = self.counts() if c is None else c
        wall = max(1e-9, time.time() - self.t0)
        eta = self.eta(c, wall)
        done = self.done(c)
        parts = [f"{int(done):,}/{self.total:,} {self.unit}"]
        if self.kind == "llm":
            if c["read"]:
                parts.append(f"{fmt_count(c['read'])} prompt tokens read ({c['read'] / wall:,.0f}/s)")
            if c["generated"]:
                parts.append(f"{fmt_count(c['generated'])} generated ({c['generated'] / wall:,.1f}/s)")
        else:
            rate = c[COUNTER[self.kind]] / wall
            parts.append(f"{rate:,.0f} {self.unit}/s" if rate >= 10 else f"{rate:,.2f} {self.unit}/s")
        if self.note:
            parts.append(self.note)
        parts.append(f"{fmt_duration(wall)} elapsed, ~{fmt_duration(eta)} left")
        return ", ".join(parts), eta

    # --------------------------------------------------------------------------------------------- showing

    def refresh(self, final: bool = False) -> str:
        c = self.counts()
        text, eta = self.line(c)
        if self.bar is not None:
            self.bar.n = min(int(self.done(c)), self.total)
            self.bar.set_postfix_str(text.split(", ", 1)[1] if ", " in text else "", refresh=False)
            self.bar.refresh()
        self.write_file(text, c, eta, final)
        return text

    def write_file(self, text: str, c: dict[str, float], eta: float | None, final: bool) -> None:
        if self.run is None or self.stage is None or (not final and time.time() - self._file_at < min(5.0, self.every_s)):
            return
        self._file_at = time.time()
        record = {"stage": self.stage, "desc": self.desc, "line": text, "done": int(self.done(c)), "total": self.total,
                  "unit": self.unit, "eta_s": None if eta is None else round(eta, 1), "updated_at": time.time(),
                  "started_at": self.t0, "pid": os.getpid(), "final": final}
        try:
            self.run.write_bytes(PROGRESS_FILE, json.dumps(record).encode())
        except Exception as e:  # progress must never cost the stage
            log.debug("progress file not written: %s", e)

    def _loop(self) -> None:
        tick = 1.0 if self.bar is not None else min(self.every_s, 5.0)
        last_log = time.time()
        while not self._stop.wait(tick):
            text = self.refresh()
            if self.bar is None and self.show and time.time() - last_log >= self.every_s:
                log.info("%s: %s", self.desc, text)
                last_log = time.time()

    def __enter__(self) -> "View":
        if self.show and (sys.stderr.isatty() or in_notebook()):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{postfix}]")
        c = self.counts()
        text, eta = self.line(c)
        if self.bar is None and self.show:
            log.info("%s: %s", self.desc, text)
        self.write_file(text, c, eta, final=False)  # `cqg-ray status` names the stage and its total from the start
        _live.append(self)
        self._thread = threading.Thread(target=self._loop, name="cqg-ray-progress-view", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self in _live:
            _live.remove(self)
        text = self.refresh(final=True)
        if self.bar is not None:
            self.bar.close()
        elif self.show:
            log.info("%s: %s", self.desc, text)
        if self.queue is not None:
            try:
                self.queue.shutdown()
            except Exception:
                pass


def read_progress(run: Any) -> dict | None:
    """The run directory's last progress record (None when there is none or it does not parse)."""
    try:
        return json.loads(run.read_bytes(PROGRESS_FILE)) if run.exists(PROGRESS_FILE) else None
    except Exception:
        return None

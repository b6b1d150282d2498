"""One writer per run directory: a lease file that names its holder and carries a heartbeat.

    with take_lease("runs/demo", "cqg-ray run"):      # LeaseHeld when another live run holds it
        ...                                          # write the run directory

``<root>/_lease.json`` holds the holder (host, pid, command, start time), a random token and ``heartbeat_at``; a thread
rewrites the heartbeat every ``ttl_s / 6`` seconds and the file is deleted on exit. A lease is *stale*, and the next
writer takes it over, when its heartbeat is older than ``ttl_s`` (default 60 s, ``CQG_RAY_LEASE_TTL_S``), or at once
when its holder ran on this machine and that process is gone (``kill -9``: a rerun resumes without waiting).
``break_lease=True`` takes a live lease too; the holder notices at its next heartbeat and stops (KeyboardInterrupt,
from a SIGINT it sends itself; ``take_lease`` handles SIGINT while it holds the lease even where the process was started
with SIGINT ignored, as a shell script's background jobs are), and ``take_lease`` raises it as ``LeaseLost``: who took
the directory, and what to do.

Guarantees, by filesystem:
- local paths (and shared POSIX filesystems): the lease is created with ``os.link`` of a written temp file (atomic,
  fails when the file exists) and every take-over, heartbeat and release runs under ``fcntl.flock`` on
  ``<root>/_lease.lock``, so of two writers started together exactly one proceeds;
- fsspec filesystems with a conditional create (``open(path, "xb")``; checked: fsspec's memory filesystem): the
  create is atomic, so of two writers starting on a free directory exactly one proceeds; a take-over of a stale
  lease reads it again, deletes it only if it is still the stale one, then creates conditionally (a window of one
  round trip in which a second taker can delete the first's new lease);
- other object stores (pyarrow's S3 / GCS filesystems): no conditional create; the writer writes the lease, waits
  ``VERIFY_S`` and reads it back, proceeding only if its own token is there. Two writers started within the same
  ``VERIFY_S`` can both proceed: best effort, see docs/pipeline.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow.fs as pafs

from cqg_ray.rundir import RunDir

log = logging.getLogger("cqg_ray")

LEASE = "_lease.json"
LOCK = "_lease.lock"
DEFAULT_TTL_S = 60.0
VERIFY_S = 2.0  # object stores without a conditional create: wait this long before reading the lease back


class LeaseHeld(RuntimeError):
    """The run directory is in use by another live writer."""

    def __init__(self, root: str, lease: dict):
        self.lease = lease
        super().__init__(f"the run directory {root} is in use by another run: {describe(lease)}.\n"
                         "Wait for it to finish, or stop it; if that run is gone (another machine, no heartbeat for a while), "
                         "it goes stale by itself after its heartbeat timeout. --break-lease takes the directory anyway "
                         "(the other run stops at its next heartbeat).")


DELETED = "deleted by someone else"  # Lease.lost where the lease file was gone, not another run's


class LeaseLost(KeyboardInterrupt):
    """This run's lease was taken by another run (--break-lease) or deleted while it ran: it stopped (a KeyboardInterrupt,
    so what handles an interruption still flushes) and says who took the directory and what to do."""

    def __init__(self, root: str, lost: str):
        self.lost = lost
        what = f"its lease file was {lost}" if lost == DELETED else f"{lost} took it with --break-lease"
        super().__init__(f"this run stopped: it no longer holds the run directory {root} ({what}), so it wrote nothing more. "
                         f"Two runs writing one directory can corrupt it: let the other run finish or stop it (`cqg-ray status "
                         f"{root}` shows it), then run this command again to resume")


def ttl_s() -> float:
    from cqg_ray.env import env_seconds

    return env_seconds("CQG_RAY_LEASE_TTL_S", DEFAULT_TTL_S)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: [state, ppid, ...]; [] where there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _pid_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); '' where unknown."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else ""


def holder(command: str) -> dict[str, Any]:
    """Who this process is, as a lease names it."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": pid, "pid_start": _pid_start(pid), "command": command,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def well_formed(lease: object) -> bool:
    """Whether ``lease`` has the shape this module writes (a holder object, a numeric heartbeat and timeout); one that
    has not is read as {}: no heartbeat, so stale."""
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # noqa: E731
    return (isinstance(lease, dict) and isinstance(lease.get("holder", {}), dict)
            and all(number(lease[k]) for k in ("heartbeat_at", "ttl_s") if lease.get(k) is not None))


def describe(lease: dict) -> str:
    h = lease.get("holder", {})
    beat = "no heartbeat" if lease.get("heartbeat_at") is None else f"last heartbeat {time.time() - float(lease['heartbeat_at']):.0f} s ago"
    return f"`{h.get('command', '?')}` (pid {h.get('pid', '?')} on {h.get('host', '?')}, started {h.get('started_at', '?')}, {beat})"


def holder_gone(lease: dict) -> bool:
    """Whether the holder ran on this machine (same host and boot) and its process no longer exists."""
    h = lease.get("holder", {})
    if h.get("host") != socket.gethostname() or h.get("boot_id") != _boot_id() or not h.get("pid"):
        return False
    pid = int(h["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    fields = _stat(pid)
    if fields and fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent
        return True
    return bool(h.get("pid_start")) and _pid_start(pid) != h["pid_start"]  # the pid now belongs to another process


def stale_reason(lease: dict, ttl: float | None = None, now: float | None = None) -> str | None:
    """Why a lease no longer protects its holder (None while it is live)."""
    if holder_gone(lease):
        return "its process is gone"
    if lease.get("heartbeat_at") is None:  # a damaged or foreign file, read as {}: its age would be counted from 1970
        return "its lease file holds no heartbeat (damaged, or not written by cqg-ray)"
    age = (time.time() if now is None else now) - float(lease.get("heartbeat_at", 0))
    limit = float(lease.get("ttl_s") or (ttl_s() if ttl is None else ttl))
    if age > limit:
        return f"no heartbeat for {age:.0f} s (timeout {limit:.0f} s)"
    if -age > limit:  # a clock far off, or a hand-edited file: it would never go stale
        return f"its heartbeat is {-age:.0f} s in the future (timeout {limit:.0f} s)"
    return None


# ----------------------------------------------------------------------------------------- filesystem operations


class _Store:
    """Create-if-absent, read, replace and delete of the lease file on one filesystem, and a critical section."""

    def __init__(self, run: RunDir):
        self.run = run
        self.path = run.path(LEASE)
        fs = run.fs
        self.fsspec = fs.handler.fs if isinstance(fs, pafs.PyFileSystem) and hasattr(fs.handler, "fs") else None
        self.kind = "local" if run.local else ("fsspec" if self.fsspec is not None and _has_conditional_create(self.fsspec) else "plain")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        if self.kind != "local":
            yield
            return
        import fcntl

        os.makedirs(self.run.root, exist_ok=True)
        fd = os.open(self.run.path(LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read(self) -> dict | None:
        try:
            with self.run.fs.open_input_stream(self.path) as f:
                data = f.read()
        except (FileNotFoundError, OSError) as e:
            if isinstance(e, FileNotFoundError) or not self.run.exists(LEASE):
                return None
            raise
        try:
            lease = json.loads(data)
        except ValueError:  # torn, foreign or not UTF-8 (JSONDecodeError, UnicodeDecodeError)
            return {}  # no heartbeat, so stale
        return lease if well_formed(lease) else {}

    def create(self, lease: dict) -> bool:
        """Write the lease only if none exists; False when one does (atomic where the filesystem allows)."""
        data = json.dumps(lease, indent=2).encode()
        if self.kind == "local":
            os.makedirs(self.run.root, exist_ok=True)
            tmp = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, self.path)
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        if self.kind == "fsspec":
            try:
                with self.fsspec.open(self.path, "xb") as f:
                    f.write(data)
                return True
            except FileExistsError:
                return False
        if self.run.exists(LEASE):
            return False
        self.replace(lease)
        time.sleep(VERIFY_S)
        return (self.read() or {}).get("token") == lease["token"]

    def replace(self, lease: dict) -> None:
        self.run.write_bytes(LEASE, json.dumps(lease, indent=2).encode())

    def delete(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.run.rm(LEASE)


def _has_conditional_create(fs: Any) -> bool:
    """Whether an fsspec filesystem is one whose mode "xb" is known to be an atomic create-if-absent."""
    cls = type(fs)
    if cls not in _CONDITIONAL:
        name = getattr(fs, "protocol", "")
        _CONDITIONAL[cls] = bool(set([name] if isinstance(name, str) else name) & {"memory"})
    return _CONDITIONAL[cls]


_CONDITIONAL: dict[type, bool] = {}


# ----------------------------------------------------------------------------------------- the lease


@dataclass
class Lease:
    """A lease this process holds on one run directory (see the module docstring)."""

    run: RunDir
    record: dict
    store: _Store
    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None
    lost: str | None = None

    @property
    def token(self) -> str:
        return self.record["token"]

    def heartbeat(self) -> bool:
        """Renew the heartbeat; False (and ``lost`` set) when another writer has taken the lease."""
        with self.store.locked():
            now = self.store.read()
            if now is None or now.get("token") != self.token:
                self.lost = describe(now) if now else DELETED
                return False
            self.record["heartbeat_at"] = time.time()
            self.store.replace(self.record)
        return True

    def _beat(self, every: float) -> None:
        assert self._stop is not None
        while not self._stop.wait(every):
            try:
                if not self.heartbeat():
                    log.error("lease on %s lost: %s; this run stops (nothing more is written)", self.run.root_uri,
                              f"its file was {DELETED}" if self.lost == DELETED else f"taken over by {self.lost}")
                    import signal

                    # a real SIGINT (it also wakes a blocked sleep or wait): KeyboardInterrupt in the main thread
                    os.kill(os.getpid(), signal.SIGINT)
                    return
            except Exception as e:  # a transient storage error: try again at the next beat, the timeout has slack
                log.warning("lease heartbeat on %s failed: %s", self.run.root_uri, e)

    def start_heartbeat(self, every: float | None = None) -> None:
        self._stop = threading.Event()
        every = every or max(0.2, float(self.record["ttl_s"]) / 6)
        self._thread = threading.Thread(target=self._beat, args=(every,), name="cqg-ray-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join(timeout=5)
        with self.store.locked():
            now = self.store.read()
            if now is not None and now.get("token") == self.token:
                self.store.delete()


_held: dict[str, Lease] = {}  # the leases this process holds, by run directory (note_stage writes into them)


def note_stage(root: str, stage: str) -> None:
    """Record in the lease this process holds on ``root`` (if any) the stage it is running now: `cqg-ray status` shows
    that stage as running while the lease is live, interrupted once it is stale."""
    lease = _held.get(RunDir(root).root_uri)
    if lease is None:
        return
    lease.record.update(stage=stage, stage_started_at=time.time())
    try:
        lease.heartbeat()
    except Exception as e:  # the next heartbeat writes it again
        log.warning("lease on %s: stage not recorded: %s", lease.run.root_uri, e)


def acquire(root: str, command: str, break_lease: bool = False, ttl: float | None = None) -> Lease:
    """Take the run directory's lease (LeaseHeld when a live writer holds it and ``break_lease`` is False)."""
    run = RunDir(root)
    store = _Store(run)
    ttl = ttl_s() if ttl is None else ttl
    record = {"holder": holder(command), "token": uuid.uuid4().hex, "heartbeat_at": time.time(), "ttl_s": ttl}
    with store.locked():
        for _ in range(3):  # a lease deleted or replaced between our read and our create: look again
            if store.create(record):
                return Lease(run, record, store)
            current = store.read()
            if current is None:
                continue
            reason = stale_reason(current, ttl)
            if reason is None and not break_lease:
                raise LeaseHeld(run.root_uri, current)
            if reason is None:
                log.warning("breaking the live lease on %s held by %s: two writers on one run directory can corrupt it; "
                            "that run stops at its next heartbeat", run.root_uri, describe(current))
            else:
                log.info("taking over the stale lease on %s of %s: %s", run.root_uri, describe(current), reason)
            if store.kind == "local":  # under the flock: replace in place, no moment without a lease
                store.replace(record)
                return Lease(run, record, store)
            again = store.read()
            if again is not None and again.get("token") != current.get("token"):
                continue  # someone else took it meanwhile: judge the new lease
            store.delete()  # object stores: delete, then the conditional create decides between racing writers
            if store.create(record):
                return Lease(run, record, store)
    current = store.read() or {}
    raise LeaseHeld(run.root_uri, current)


@contextlib.contextmanager
def take_lease(root: str, command: str, break_lease: bool = False) -> Iterator[Lease]:
    """Hold the run directory's lease, with a heartbeat, for the duration of the block."""
    lease = acquire(root, command, break_lease)
    with sigint_handled():
        lease.start_heartbeat()
        _held[lease.run.root_uri] = lease
        try:
            yield lease
        except KeyboardInterrupt as e:
            if lease.lost is None or isinstance(e, LeaseLost):
                raise
            raise LeaseLost(lease.run.root_uri, lease.lost) from None  # the SIGINT the heartbeat sent: said as what it was
        finally:
            _held.pop(lease.run.root_uri, None)
            lease.release()


def lease_lost(root: str) -> str | None:
    """Who took the lease this process holds on ``root`` from it (``Lease.lost``), inside ``take_lease``; else None."""
    lease = _held.get(RunDir(root).root_uri)
    return lease.lost if lease is not None else None


@contextlib.contextmanager
def sigint_handled() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt inside the block even where the process started with SIGINT ignored (a shell
    script's ``cmd &``, a test runner's worker): a lost lease stops its holder with that signal. Outside the main
    thread, or where SIGINT already has a handler, nothing changes."""
    import signal

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def current(root: str) -> dict | None:
    """The lease a run directory holds now (None when free); for `cqg-ray status`."""
    run = RunDir(root)
    return _Store(run).read() if run.exists(LEASE) else None

"""The S3 gateway's worker processes (`--workers N`) and the process that keeps them serving.

With N > 1 the gateway's own process (the pid `ecstore cluster up` records in cluster.json)
serves nothing: it forks N workers that share the port (SO_REUSEPORT) and supervises them.
- A worker that exits (a crash, SIGKILL, the OOM killer) is reaped, logged in one line
  (`worker exited worker=I pid=P exit="killed by SIGKILL" restart_in_s=...`) and started
  again: at once if it had run STABLE_UPTIME_S, else after a backoff doubling from
  RESTART_BACKOFF_FIRST_S up to RESTART_BACKOFF_MAX_S, so a worker that dies at start
  costs a fork every 30 s, not a fork loop.
- A worker that sends no heartbeat over its pipe (one every HEARTBEAT_INTERVAL_S from its
  event loop) for `stall_timeout_s` (ECSTORE_GATEWAY_WORKER_TIMEOUT_S) is killed with
  SIGKILL, logged (`worker stalled`) and so replaced: a stopped (SIGSTOP) or wedged worker
  keeps its SO_REUSEPORT socket, and the kernel keeps giving it 1/N of new connections,
  which hang. The connections already queued on it are reset when it dies.
- SIGTERM or SIGINT is passed on (with SIGCONT, so a stopped worker gets it too); workers
  finish what is in flight (node.server.SHUTDOWN_TIMEOUT_S) and the process exits 0.
- If a worker exits before any worker ever sent a heartbeat (listening), the gateway
  cannot start (its port taken, a bad setting): it stops the others and exits 1, as one
  process would, instead of retrying what cannot work.

Why a supervisor that does not serve (until now the first process served and forked the
others): a serving process runs an event loop, threads (the log flusher, executors) and
client connections, and a fork of it copies them mid-flight (a lock another thread held
stays held in the child); the supervisor is one thread with no loop and forks every worker,
first or replacement, from the same state. And a process that serves cannot replace
itself: stopped, its share of connections hangs with nobody to notice; killed, its workers
go with it. What is left is the supervisor itself, which does little but wait:
- killed (SIGKILL), its workers see their parent change within HEARTBEAT_INTERVAL_S and
  exit (no orphans serving a stale cluster); its pid is gone, so `ecstore cluster up`,
  systemd or Docker's restart policy starts the gateway again, as before;
- stopped (SIGSTOP), the workers go on serving (a heartbeat into a full pipe is dropped);
  nothing is supervised until it is continued.

Counts are kept in a page shared with every worker (WorkerStats), so whichever worker a
scrape or the status page reaches shows the gateway's numbers.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node.logs import log_event
from node.metrics import Families, counter, gauge
from node.server import SHUTDOWN_TIMEOUT_S

log = logging.getLogger("ecstore.gateway")

HEARTBEAT_INTERVAL_S = 1.0
STALL_TIMEOUT_ENV = "ECSTORE_GATEWAY_WORKER_TIMEOUT_S"
DEFAULT_STALL_TIMEOUT_S = 10.0     # no heartbeat this long: the worker is killed
MIN_STALL_TIMEOUT_S = 2.0          # two heartbeats at least
START_GRACE_S = 30.0               # from fork to the first heartbeat (the app's startup)
STABLE_UPTIME_S = 10.0             # a worker that ran this long is restarted at once
RESTART_BACKOFF_FIRST_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
STOP_GRACE_S = SHUTDOWN_TIMEOUT_S + 5.0   # after SIGTERM, then SIGKILL
TICK_S = 0.1                       # the supervisor's longest sleep
MAX_HEARTBEAT_READ_BYTES = 4096


# ---- decisions (pure) ------------------------------------------------------------------------
def restart_delay_s(quick_exits: int) -> float:
    """Seconds before a worker is started again after `quick_exits` exits in a row of
    workers in its place that ran less than STABLE_UPTIME_S (0: the last ran longer)."""
    if quick_exits <= 0:
        return 0.0
    return float(min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_FIRST_S * 2 ** (quick_exits - 1)))


def exit_reason(status: int) -> str:
    """How a process ended, from its wait status: "exited with 1", "killed by SIGKILL"."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}" + (" (core dumped)" if os.WCOREDUMP(status) else "")
    if os.WIFEXITED(status):
        return f"exited with {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


def stall_timeout_from_env() -> float:
    """$ECSTORE_GATEWAY_WORKER_TIMEOUT_S (seconds, at least MIN_STALL_TIMEOUT_S), else
    DEFAULT_STALL_TIMEOUT_S; SystemExit with a reason if it is not a number in range."""
    text = os.environ.get(STALL_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_STALL_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not MIN_STALL_TIMEOUT_S <= value <= 3600:
        raise SystemExit(f"{STALL_TIMEOUT_ENV} must be seconds from {MIN_STALL_TIMEOUT_S:g} to "
                         f"3600, got {text!r}")
    return value


# ---- counts shared with the workers ------------------------------------------------------------
class WorkerStats:
    """Counts the supervisor writes and every worker reads: an anonymous shared mapping made
    before the first fork (8-byte aligned words: a reader never sees half a write)."""

    FIELDS = ("configured", "running", "restarts", "stalls")
    _FORMAT = "<" + "q" * len(FIELDS)

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, struct.calcsize(self._FORMAT))

    def get(self) -> dict[str, int]:
        return dict(zip(self.FIELDS, struct.unpack_from(self._FORMAT, self._mem)))

    def set(self, **values: int) -> None:
        now = self.get()
        now.update(values)
        struct.pack_into(self._FORMAT, self._mem, 0, *(now[f] for f in self.FIELDS))

    def add(self, name: str, n: int = 1) -> None:
        self.set(**{name: self.get()[name] + n})


def workers_view(stats: WorkerStats | None) -> dict[str, Any]:
    """The status page's "workers": counts of the supervisor, or of the one process that
    serves without one (--workers 1), and the pid of the worker answering."""
    counts = stats.get() if stats is not None else {"configured": 1, "running": 1, "restarts": 0,
                                                   "stalls": 0}
    return {**counts, "supervised": stats is not None, "pid": os.getpid()}


def worker_metrics(stats: WorkerStats | None) -> Families:
    v = workers_view(stats)
    yield gauge("ecstore_gateway_workers", "Gateway worker processes serving now.", v["running"])
    yield gauge("ecstore_gateway_workers_configured", "Gateway worker processes to keep "
                "serving (--workers).", v["configured"])
    yield counter("ecstore_gateway_worker_restarts", "Gateway workers started again after one "
                  "exited or was killed.", v["restarts"])
    yield counter("ecstore_gateway_worker_stalls", "Gateway workers killed (then replaced) for "
                  "sending no heartbeat for ECSTORE_GATEWAY_WORKER_TIMEOUT_S: stopped or wedged.",
                  v["stalls"])


# ---- in a worker ---------------------------------------------------------------------------------
class Heartbeat:
    """A worker's side: once it listens (`start`, node.server.run's `ready`), a byte down
    its pipe every HEARTBEAT_INTERVAL_S from its event loop; when its parent is gone
    (killed), SIGTERM to itself: it stops as if told to."""

    def __init__(self, parent_pid: int, fd: int) -> None:
        self.parent_pid, self.fd = parent_pid, fd
        self.task: asyncio.Future[None] | None = None

    def start(self) -> None:
        os.set_blocking(self.fd, False)
        self.task = asyncio.ensure_future(self._beat())

    async def _beat(self) -> None:
        while True:
            if os.getppid() != self.parent_pid:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            try:
                os.write(self.fd, b".")
            except BlockingIOError:
                pass   # the supervisor is stopped and its pipe full: it reads them all later
            except BrokenPipeError:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            await asyncio.sleep(HEARTBEAT_INTERVAL_S)


# ---- the supervisor ---------------------------------------------------------------------------
@dataclass
class Slot:
    """One of the N workers' places: the process in it now, and its history."""

    index: int
    pid: int | None = None
    fd: int | None = None          # the read end of its heartbeat pipe
    started: float = 0.0           # monotonic
    last_heard: float | None = None
    quick_exits: int = 0
    start_at: float = 0.0          # when an empty slot gets its next worker


# serve(worker index, heartbeat write fd): runs in the forked child and serves until told
# to stop; the supervisor's state is closed before it is called
Serve = Callable[[int, int], None]


class Supervisor:
    def __init__(self, workers: int, serve: Serve, stall_timeout_s: float,
                 stats: WorkerStats) -> None:
        assert workers >= 1 and stall_timeout_s > 0
        self.serve, self.stall_timeout_s, self.stats = serve, stall_timeout_s, stats
        self.slots = [Slot(i) for i in range(1, workers + 1)]
        self.ever_heard = False
        self.stopping = False
        stats.set(configured=workers, running=0)

    def run(self) -> int:
        """Start the workers and keep them serving until SIGTERM or SIGINT (then 0), or
        until the gateway cannot start (1)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for slot in self.slots:
            self._spawn(slot)
        while not self.stopping:
            self._listen(TICK_S)
            for slot, pid, status in self._reaped():
                if not self.ever_heard:
                    log.error("gateway worker %d (pid %d) %s before any worker listened: the "
                              "gateway cannot start, stopping", slot.index, pid,
                              exit_reason(status))
                    self._stop()
                    return 1
                self._schedule_restart(slot, pid, status)
            self._kill_stalled()
            self._start_due()
        self._stop()
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True

    def _spawn(self, slot: Slot) -> None:
        read_fd, write_fd = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:   # out of memory or processes: try again later
            os.close(read_fd)
            os.close(write_fd)
            slot.quick_exits += 1
            slot.start_at = time.monotonic() + restart_delay_s(slot.quick_exits)
            log.error("gateway worker %d: cannot fork (%s)", slot.index, exc)
            return
        if pid == 0:
            os.close(read_fd)
            self._become_worker(slot.index, write_fd)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        slot.pid, slot.fd, slot.started, slot.last_heard = pid, read_fd, time.monotonic(), None
        self.stats.set(running=sum(s.pid is not None for s in self.slots))

    def _become_worker(self, index: int, heartbeat_fd: int) -> None:
        """In the child: drop the supervisor's pipes and signal handlers, serve, exit."""
        code = 0
        try:
            for s in self.slots:
                if s.fd is not None:
                    os.close(s.fd)
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            self.serve(index, heartbeat_fd)
        except SystemExit as exc:   # e.g. "cannot listen on ...": one line, exit 1
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else 1 if exc.code else 0
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os._exit(code)

    def _listen(self, timeout_s: float) -> None:
        """Wait up to timeout_s for heartbeats (a signal cuts the wait short) and note them."""
        fds = {s.fd: s for s in self.slots if s.fd is not None}
        try:
            ready, _, _ = select.select(list(fds), [], [], timeout_s) if fds else ([], [], [])
        except InterruptedError:
            return
        if not fds:
            time.sleep(timeout_s)
        now = time.monotonic()
        for fd in ready:
            with contextlib.suppress(BlockingIOError):
                if os.read(fd, MAX_HEARTBEAT_READ_BYTES):
                    fds[fd].last_heard = now
                    self.ever_heard = True

    def _reaped(self) -> list[tuple[Slot, int, int]]:
        """(slot, pid, wait status) of each worker that has exited, now reaped; its slot
        is empty."""
        out = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            slot = next((s for s in self.slots if s.pid == pid), None)
            if slot is None:
                continue
            if slot.fd is not None:
                os.close(slot.fd)
            slot.pid = slot.fd = None
            out.append((slot, pid, status))
        self.stats.set(running=sum(s.pid is not None for s in self.slots))
        return out

    def _schedule_restart(self, slot: Slot, pid: int, status: int) -> None:
        now = time.monotonic()
        slot.quick_exits = slot.quick_exits + 1 if now - slot.started < STABLE_UPTIME_S else 0
        delay_s = restart_delay_s(slot.quick_exits)
        slot.start_at = now + delay_s
        log_event(log, logging.WARNING, "worker exited",
                  {"worker": slot.index, "pid": pid, "exit": exit_reason(status),
                   "uptime_s": round(now - slot.started, 1), "restart_in_s": delay_s})

    def _kill_stalled(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.pid is None:
                continue
            since, limit = ((slot.last_heard, self.stall_timeout_s) if slot.last_heard is not None
                            else (slot.started, START_GRACE_S))
            if now - since > limit:
                log_event(log, logging.WARNING, "worker stalled",
                          {"worker": slot.index, "pid": slot.pid,
                           "silent_s": round(now - since, 1), "action": "SIGKILL"})
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signal.SIGKILL)
                self.stats.add("stalls")
                slot.last_heard = now + 3600   # killed: not again while it is reaped

    def _start_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.pid is None and now >= slot.start_at:
                self._spawn(slot)
                if slot.pid is not None:
                    self.stats.add("restarts")
                    log.info("gateway worker %d started again (pid %d)", slot.index, slot.pid)

    def _stop(self) -> None:
        """SIGTERM (and SIGCONT) to every worker; wait for them, killing a silent one (a
        stalled worker does not drain) and, after STOP_GRACE_S, any still there."""
        for slot in self.slots:
            if slot.pid is not None:
                for sig in (signal.SIGTERM, signal.SIGCONT):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(slot.pid, sig)
        deadline = time.monotonic() + STOP_GRACE_S
        while any(s.pid is not None for s in self.slots):
            if time.monotonic() > deadline:
                for slot in self.slots:
                    if slot.pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(slot.pid, signal.SIGKILL)
            self._listen(TICK_S)
            self._reaped()
            self._kill_stalled()

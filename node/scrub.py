"""Scrub: re-read every fragment in the background and quarantine the corrupt ones.

A `Scrubber` walks the store in fragment id order with a cursor (the last id checked),
one batch per `step()`, and wraps around at the end of a pass. `scrub_loop` paces the
steps so the bytes read per second stay under the configured rate, and rests between
passes. `scrub_now` runs one whole pass at full speed (POST /v1/scrub).

The background scrubber's place and the end of the last whole pass are kept in
`scrub.json` under the node's data directory (written at most once a minute and at the
end of each pass, best effort): a node restarted mid-pass goes on from where it was, and
one restarted after a pass rests out the interval, instead of starting over each time -
a node restarted more often than a pass takes would otherwise never finish one.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.fragments import FragmentStore
from node.logs import log_step
from store.errors import Corrupt, NotFound

log = logging.getLogger("ecstore.scrub")

BYTES_PER_MB = 1_000_000
DEFAULT_SCRUB_RATE_MB_S = 8.0          # background read rate; 0 turns the scrub off
DEFAULT_SCRUB_PASS_INTERVAL_S = 3600.0  # rest after a complete pass
DEFAULT_SCRUB_START_DELAY_S = 60.0      # after the node starts, before the first step
SCRUB_BATCH_FRAGMENTS = 32              # at most this many fragments per background step
SCRUB_STEP_BUDGET_S = 1.0               # a background step reads ~ rate x this many bytes
SCRUB_MIN_PAUSE_S = 0.01                # between steps, however small the fragments
SCRUB_ERROR_PAUSE_S = 30.0              # after a step failed unexpectedly
SCRUB_LIST_PAGE = 1000                  # fragment ids fetched per listing
FULL_SPEED_BATCH_FRAGMENTS = 256        # per step of scrub_now
SCRUB_STATE_FILE = "scrub.json"         # under the data directory
SCRUB_STATE_SAVE_S = 60.0               # the background scrubber's place, saved this often


@dataclass
class StepResult:
    checked: int = 0
    bytes_checked: int = 0
    corrupt: list[str] = field(default_factory=list)
    pass_complete: bool = False

    def add(self, other: "StepResult") -> None:
        self.checked += other.checked
        self.bytes_checked += other.bytes_checked
        self.corrupt.extend(other.corrupt)
        self.pass_complete = other.pass_complete


class ScrubStats:
    """Totals of every scrubber of one node (background and on demand), for /v1/status."""

    def __init__(self, state_path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self.last_pass_completed_at: float | None = None  # unix seconds
        self.fragments_checked_total = 0
        self.bytes_checked_total = 0
        self.corrupt_found_total = 0
        self.passes_running = 0
        self.cursor = ""            # the background scrubber's place, as last saved
        self.state_path = state_path
        self._saved_at = 0.0
        if state_path is not None:
            self._load(state_path)

    def _load(self, path: Path) -> None:
        try:
            state = json.loads(path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:    # damaged: a fresh start, said once
            log.warning("ignoring %s: %s", path, exc)
            return
        if not isinstance(state, dict):
            return
        done, cursor = state.get("last_pass_completed_at"), state.get("cursor")
        if isinstance(done, (int, float)) and not isinstance(done, bool) and done > 0:
            self.last_pass_completed_at = float(done)
        if isinstance(cursor, str):
            self.cursor = cursor

    def save(self, cursor: str | None = None, force: bool = False) -> None:
        """Keep the end of the last pass and the background scrubber's `cursor` (None:
        unchanged) in the state file: at most once per SCRUB_STATE_SAVE_S unless `force`.
        Best effort - a full or failing disk costs a rescan after a restart, no more."""
        with self._lock:
            if cursor is not None:
                self.cursor = cursor
            now = time.monotonic()
            if self.state_path is None or (not force and now - self._saved_at < SCRUB_STATE_SAVE_S):
                return
            self._saved_at = now
            state = {"last_pass_completed_at": self.last_pass_completed_at,
                     "cursor": self.cursor}
        tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            log.warning("could not save the scrub state to %s: %s", self.state_path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()

    def pass_started(self) -> None:
        with self._lock:
            self.passes_running += 1

    def record(self, r: StepResult) -> None:
        with self._lock:
            self.fragments_checked_total += r.checked
            self.bytes_checked_total += r.bytes_checked
            self.corrupt_found_total += len(r.corrupt)
            if r.pass_complete:
                self.passes_running -= 1
                self.last_pass_completed_at = time.time()
        if r.pass_complete:
            self.save(force=True)

    def abandoned(self) -> None:
        """A pass that will not complete (its scrubber stopped)."""
        with self._lock:
            self.passes_running -= 1

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"last_pass_completed_at": self.last_pass_completed_at,
                    "fragments_checked_total": self.fragments_checked_total,
                    "corrupt_found_total": self.corrupt_found_total,
                    "running": self.passes_running > 0}


class Scrubber:
    """Checks the fragments of one store in sorted id order, a batch per step()."""

    def __init__(self, store: FragmentStore, stats: ScrubStats | None = None,
                 list_page: int = SCRUB_LIST_PAGE, resume: bool = False) -> None:
        """`resume`: the background scrubber - it starts at the place `stats` saved and
        keeps saving its place there."""
        self.store = store
        self.stats = stats if stats is not None else ScrubStats()
        self.list_page = list_page
        self.resume = resume
        self.cursor = self.stats.cursor if resume else ""  # the last fragment id checked
        self._pending: deque[str] = deque()  # listed after the cursor, not yet checked
        self._listed_to_end = False
        self._in_pass = False

    def step(self, batch: int = SCRUB_BATCH_FRAGMENTS, max_bytes: int | None = None
             ) -> StepResult:
        """Check up to `batch` fragments (fewer once `max_bytes` were read); blocking."""
        if batch < 1:
            raise ValueError("batch must be at least 1")
        if not self._in_pass:
            self._in_pass = True
            self.stats.pass_started()
        r = StepResult()
        while r.checked < batch and (max_bytes is None or r.bytes_checked < max_bytes):
            if not self._pending:
                if self._listed_to_end:
                    break
                page = self.store.list(self.cursor, self.list_page)
                self._pending.extend(page)
                self._listed_to_end = len(page) < self.list_page
                if not page:
                    break
            fid = self._pending.popleft()
            self.cursor = fid
            self._check(fid, r)
        if not self._pending and self._listed_to_end:
            r.pass_complete = True
            self.cursor, self._listed_to_end, self._in_pass = "", False, False
        if self.resume:
            self.stats.cursor = self.cursor     # saved below at a pass's end, or now and then
        self.stats.record(r)
        if self.resume and not r.pass_complete:
            self.stats.save(self.cursor)
        return r

    def _check(self, fid: str, r: StepResult) -> None:
        try:
            raw, inode = self.store.read_raw(fid, uncached=True)   # keeps readers' cache
        except NotFound:  # deleted (or quarantined by a read) since it was listed
            return
        except Corrupt as exc:   # unreadable (EIO): counted, quarantined, rebuilt by repair
            r.checked += 1
            self._quarantine(fid, None, exc, r)
            return
        r.checked += 1
        r.bytes_checked += len(raw)
        try:
            self.store.check_record(fid, raw, inode)
        except Corrupt as exc:
            self._quarantine(fid, inode, exc, r)

    def _quarantine(self, fid: str, where: int | None, exc: Corrupt, r: StepResult) -> None:
        if self.store.quarantine_fragment(fid, where):
            log.warning("quarantined %s: %s", fid, exc.message)
            r.corrupt.append(fid)

    def close(self) -> None:
        if self._in_pass:
            self._in_pass = False
            self.stats.abandoned()


def scrub_now(store: FragmentStore, stats: ScrubStats) -> StepResult:
    """One whole pass from the first fragment, at full speed; blocking."""
    scrubber = Scrubber(store, stats)
    total = StepResult()
    try:
        while not total.pass_complete:
            total.add(scrubber.step(FULL_SPEED_BATCH_FRAGMENTS))
    finally:
        scrubber.close()
    return total


def pacing_pause_s(bytes_checked: int, elapsed_s: float, rate_bytes_per_s: float) -> float:
    """Seconds to rest after a step that read `bytes_checked` in `elapsed_s`, so that
    the step's bytes over (elapsed + rest) stay at or under `rate_bytes_per_s`."""
    if rate_bytes_per_s <= 0:
        raise ValueError("rate must be positive")
    return max(0.0, bytes_checked / rate_bytes_per_s - elapsed_s)


def step_budget_bytes(rate_bytes_per_s: float) -> int:
    """Bytes one background step may read: about SCRUB_STEP_BUDGET_S of the rate."""
    return max(1, int(rate_bytes_per_s * SCRUB_STEP_BUDGET_S))


async def scrub_loop(scrubber: Scrubber, rate_mb_s: float, pass_interval_s: float,
                     start_delay_s: float) -> None:
    """Step `scrubber` forever at no more than `rate_mb_s`; cancel to stop."""
    rate = rate_mb_s * BYTES_PER_MB
    step = functools.partial(scrubber.step, SCRUB_BATCH_FRAGMENTS, step_budget_bytes(rate))
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(start_delay_s)
        done = scrubber.stats.last_pass_completed_at
        if done is not None and not scrubber.cursor:    # restarted between passes
            await asyncio.sleep(max(0.0, min(pass_interval_s, done + pass_interval_s - time.time())))
        while True:
            started = time.monotonic()
            try:
                r = await loop.run_in_executor(None, step)
            except Exception:  # a bug or a disk error: log it, keep the node serving
                log.exception("scrub step failed")
                await asyncio.sleep(SCRUB_ERROR_PAUSE_S)
                continue
            if r.checked or r.corrupt:  # an idle step (nothing stored) is not worth a line
                log_step("scrub", started, checked=r.checked, bytes_checked=r.bytes_checked,
                         corrupt=len(r.corrupt), pass_complete=r.pass_complete)
            pause = max(SCRUB_MIN_PAUSE_S,
                        pacing_pause_s(r.bytes_checked, time.monotonic() - started, rate))
            if r.pass_complete:
                pause = max(pause, pass_interval_s)
            await asyncio.sleep(pause)
    finally:
        scrubber.close()

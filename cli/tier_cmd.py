"""`ecstore tier status` and `ecstore tier run`: hot and cold tiers (store/tiering.py)."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.table import Table

from cli.argtypes import non_negative, positive
from cli.main import drive, out, report_table, with_client
from store.client import Client
from store.errors import BadRequest
from store.tiering import (
    DEFAULT_COLD_AFTER_S,
    DEFAULT_PROMOTE_READS,
    DEFAULT_WINDOW_S,
    TierRules,
    TierWorker,
    tier_status,
)


def rules(a: argparse.Namespace) -> TierRules:
    if a.promote_reads < 1:   # --cold-after and --window are checked by argparse
        raise BadRequest("--promote-reads must be >= 1")
    return TierRules(a.cold_after, a.promote_reads, a.window)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


async def cmd_tier_status(c: Client, a: argparse.Namespace) -> int:
    await c.flush_reads()
    st = await tier_status(c, rules(a))
    if a.json:
        print(json.dumps(st.to_dict(), indent=2))
        return 0
    cmap = await c.cluster_map()
    pols = {p.name: p for p in cmap.policies}
    t = Table(title="tiers", box=None)
    for col in ("policy", "tier", "k+m", "objects", "MiB", "MiB stored"):
        t.add_column(col, justify="left" if col in ("policy", "tier") else "right")
    for name, row in sorted(st.tiers.items()):
        p = pols.get(name)
        copies = cmap.effective_replicas   # an inline object: one copy per record replica
        t.add_row(name, p.tier if p else "control", f"{p.k}+{p.m}" if p else
                  f"{copies} cop{'y' if copies == 1 else 'ies'}",
                  f"{row['objects']:,}", _mib(row["bytes"]), _mib(row["stored_bytes"]))
    out.print(t)
    due = st.to_dict()["due"]
    for action, what in (("demote", "to cold"), ("promote", "to hot")):
        d = due.get(action, {"objects": 0, "bytes": 0})
        out.print(f"due {what}: {d['objects']:,} objects, {_mib(d['bytes'])} MiB")
    return 0


async def cmd_tier_run(c: Client, a: argparse.Namespace) -> int:
    r = rules(a)
    passes = 0
    while True:
        await c.flush_reads()
        st = await tier_status(c, r)
        worker = TierWorker(c, st, r, dry_run=a.dry_run, rate_mb_s=a.rate)
        ops = await drive(worker, "tiering", lambda: f"tiering ({worker.remaining} left)",
                          show=sys.stderr.isatty() and not a.json, last=False)
        rep = worker.report
        if ops is not None:     # failed on the status page when the pass failed some
            await ops.end(1 if rep.failed else 0)
        if a.json:
            print(json.dumps(rep.to_dict()))
        else:
            rows: list[tuple[str, object]] = [
                ("demoted to cold", rep.demoted), ("promoted to hot", rep.promoted),
                ("MB moved", round(rep.bytes_moved / 1e6, 1)),
                ("superseded by a newer write", rep.superseded),
                ("failed", rep.failed), ("MB/s", rep.mb_s(rep.bytes_moved))]
            if a.dry_run:   # nothing was moved: what a pass would do, at no rate
                rows = [("would demote to cold", rep.demoted), ("would promote to hot", rep.promoted),
                        ("MB to move", round(rep.bytes_moved / 1e6, 1))]
            report_table("tiering pass" + (" (dry run: nothing moved)" if a.dry_run else ""),
                         rows, rep.errors)
        passes += 1
        if a.once:
            return 1 if rep.failed else 0
        await asyncio.sleep(a.interval)


def register(sub: Any) -> None:
    """Add `tier status|run` to the ecstore parser's subparsers."""
    tp = sub.add_parser("tier", help="hot and cold tiers: status, and moving objects by use")
    tsub = tp.add_subparsers(dest="tier_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--cold-after", type=non_negative, default=DEFAULT_COLD_AFTER_S, metavar="S",
                       help="move hot objects not read for this many seconds to the cold "
                       f"policy (default {DEFAULT_COLD_AFTER_S:g}: a week)")
        p.add_argument("--promote-reads", type=int, default=DEFAULT_PROMOTE_READS, metavar="N",
                       help="move cold objects read N times within the window back to hot "
                       f"(default {DEFAULT_PROMOTE_READS})")
        p.add_argument("--window", type=positive, default=DEFAULT_WINDOW_S, metavar="S",
                       help=f"the promotion window, seconds (default {DEFAULT_WINDOW_S:g})")
        p.add_argument("--json", action="store_true")

    st = tsub.add_parser("status", help="objects and bytes per policy, and what is due to move")
    common(st)
    st.set_defaults(func=with_client(cmd_tier_status))
    run = tsub.add_parser("run", help="move what is due (re-encode into the other policy)")
    common(run)
    run.add_argument("--once", action="store_true", help="one pass, then exit")
    run.add_argument("--interval", type=positive, default=600.0, metavar="S",
                     help="rest between passes without --once (default 600)")
    run.add_argument("--dry-run", action="store_true", help="report what would move")
    run.add_argument("--rate", type=non_negative, default=0.0, metavar="MB/s",
                     help="limit bytes moved per second (default: no limit)")
    run.set_defaults(func=with_client(cmd_tier_run))

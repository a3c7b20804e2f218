"""`ecstore gc`: garbage collection. Parsing and presentation only (the work is store/gc.py)."""
from __future__ import annotations

import argparse
import json
from typing import Any

from cli.argtypes import non_negative
from cli.main import drive, err, human, report_table, with_client
from store.client import INTENT_AFTER_S, Client
from store.errors import BadRequest
from store.gc import DEFAULT_GRACE_S, prepare_gc

SHORT_GRACE_S = 600     # below this, say what a grace shorter than a put costs
MIN_GRACE_S = 60        # below this, only with --force: puts tell gc they run after INTENT_AFTER_S


async def cmd_gc(c: Client, a: argparse.Namespace) -> int:
    if a.grace < MIN_GRACE_S and not a.dry_run and not a.force:
        raise BadRequest(f"a grace under {MIN_GRACE_S} s can delete the fragments of a put "
                         "still in progress, which may then be acknowledged without them; "
                         "--force if no put runs now (an empty cluster, a test)")
    if a.grace < MIN_GRACE_S and not a.dry_run:
        err.print(f"[yellow]warning:[/] a grace of {a.grace:g} s deletes the fragments of any "
                  f"put or tiering move still in progress that started more than "
                  f"{a.grace:g} s ago (its record is not written yet) unless it has told gc "
                  f"it runs (after {INTENT_AFTER_S:g} s): it may then be acknowledged "
                  "without them, and the object is lost. Use it only when none runs",
                  highlight=False)
    elif a.grace < SHORT_GRACE_S and not a.dry_run:
        # puts and tiering moves are safe from a grace of MIN_GRACE_S: they tell gc they
        # run after INTENT_AFTER_S (one that could not fails at its commit, 503); what a
        # short grace costs is the readers of old versions
        err.print(f"[yellow]warning:[/] a grace of {a.grace:g} s deletes a version "
                  f"{a.grace:g} s after it was overwritten or deleted: a reader still reading "
                  "it then (a long stream, a training worker mid-shard) fails",
                  highlight=False)
    err.print("reading fragment listings, then metadata ...")
    worker = await prepare_gc(c, a.grace, a.dry_run)
    r = worker.report
    ops = await drive(worker, "gc" + (" (dry run)" if a.dry_run else ""),
                      lambda: f"gc: {r.fragments_deleted} fragments deleted, "
                              f"{r.tombstones_purged} tombstones purged",
                      err.is_terminal and not a.json, total=worker.total, last=False)
    if ops is not None:     # the status page says failed when gc exits 1
        await ops.end(1 if worker.report.to_dict()["error_count"] else 0)
    rep = worker.report.to_dict()
    rep["grace_s"] = a.grace
    rep["dry_run"] = a.dry_run
    if a.json:
        print(json.dumps(rep, indent=2))
    else:
        _table(rep)
    return 1 if rep["error_count"] else 0


def _table(rep: dict[str, Any]) -> None:
    title = f"garbage collection, grace {rep['grace_s']:g} s"
    if rep["dry_run"]:
        title += " (dry run: nothing deleted)"
    rows: list[tuple[str, object]] = [
        ("fragments listed", rep["fragments_listed"]),
        ("fragments garbage", rep["fragments_garbage"]),
        ("  of them stray copies", rep["fragments_stray"]),
        ("  strays kept: the map changed", rep["strays_kept"]),
        ("fragments deleted", rep["fragments_deleted"]),
        ("  bytes they held", "-" if rep["bytes_deleted"] is None else human(rep["bytes_deleted"])),
        ("kept: live", rep["kept_live"]),
        ("kept: younger than grace", rep["kept_young"]),
        ("  of them older, replaced within grace", rep["kept_replaced"]),
        ("puts running (kept)", rep["puts_running"]),
        ("tombstones seen", rep["tombstones_seen"]),
        ("tombstones purgeable", rep["tombstones_purgeable"]),
        ("tombstones purged", rep["tombstones_purged"]),
        ("tombstones repaired first", rep["tombstones_repaired"]),
        ("tombstones younger than grace", rep["tombstones_young"]),
        ("tombstones kept: held by a non-owner", rep["tombstones_held_elsewhere"]),
        ("part records no upload names", rep["orphan_parts"]),
        ("  their fragments (in garbage)", rep["orphan_part_fragments"]),
        ("  part records forgotten", rep["orphan_parts_forgotten"]),
        ("  younger than grace (kept)", rep["orphan_parts_young"]),
        ("errors", rep["error_count"])]
    if rep["kept_foreign"]:
        rows.insert(5, ("kept: not a fragment id", rep["kept_foreign"]))
    report_table(title, rows, rep["errors"])


def register(sub: Any) -> None:
    """Add the `gc` subcommand to the ecstore parser's subparsers."""
    gc = sub.add_parser("gc", help="delete fragments no live object needs, purge old tombstones")
    gc.add_argument("--grace", type=non_negative, default=DEFAULT_GRACE_S, metavar="S",
                    help="only versions and tombstones older than S seconds are collected "
                         f"(default {DEFAULT_GRACE_S:g}; must exceed the longest put)")
    gc.add_argument("--dry-run", action="store_true", help="report what is garbage, delete nothing")
    gc.add_argument("--json", action="store_true")
    gc.add_argument("--force", action="store_true",
                    help=f"take a grace under {MIN_GRACE_S} s (no put may be running)")
    gc.set_defaults(func=with_client(cmd_gc))

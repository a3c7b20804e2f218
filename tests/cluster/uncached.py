"""Uncached writes and reads as tests of a running cluster see them: each storage node's
counters and support gauge (/metrics), and a skip, naming why, where the kernel has no such write."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from cli.localcluster import LocalCluster, signed_request
from tests import scrape
from tests.functional.harness import dontcache_refusal


def skip_unless_uncached_writes() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        why = dontcache_refusal(Path(tmp))
    if why is not None:
        pytest.skip(why)


def counters(metrics_text: str) -> dict[str, float]:
    """ecstore_storage_uncached_writes_total and _supported, and
    ecstore_storage_uncached_reads_total, from a /metrics page."""
    return scrape.counters(metrics_text, ("uncached_writes_total", "uncached_writes_supported",
                                          "uncached_reads_total"), prefix="ecstore_storage_")


def node_counters(cluster: LocalCluster, node_id: str) -> dict[str, float]:
    """One storage node's counters (one signed /metrics scrape)."""
    n = cluster.nodes[node_id]
    return counters(signed_request(cluster.secret, "GET", n.url, "/metrics").decode())


def uncached_writes(cluster: LocalCluster) -> int:
    """Fragments written uncached, all storage nodes together."""
    return sum(int(node_counters(cluster, i)["uncached_writes_total"])
               for i, n in cluster.nodes.items() if n.role == "storage")

"""PyTorch Distributed Checkpoint on ecstore (store/dcp.py): 4 CPU ranks (gloo, one process
each) save and load a model and its optimizer; a save cut short by a failing or killed rank
leaves the previous generation latest; a load reads only what its rank needs; pruning
removes every object of old generations. Pure planning is checked against naive models.

The ranks run once per module (`ranks` fixture) through every step and report what they
saw; each test then checks one behaviour. Skipped when PyTorch is not installed.
"""
from __future__ import annotations

import gc
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'ecstore[torch]')")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

from cli.localcluster import LocalCluster, free_port  # noqa: E402
from store.client import SyncClient  # noqa: E402
from store.dcp import (  # noqa: E402
    Checkpoints,
    EcstoreReader,
    EcstoreWriter,
    Generation,
    choose_prune,
    group_generations,
    new_generation_name,
    plan_range_reads,
    split_by_size,
)
from store.errors import BadRequest, Conflict  # noqa: E402
from store.listing import ListEntry  # noqa: E402
from tests.cluster.uncached import skip_unless_uncached_writes, uncached_writes  # noqa: E402

pytestmark = [pytest.mark.cluster,
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")]

ROOT = Path(__file__).resolve().parents[2]
WORLD = 4
BUCKET = "ckpt"
PREFIX = "run-1"
RANKS_TIMEOUT_S = 150.0
FAILING_RANK = 2        # raises in write_data of g2, after its objects are written
KILLED_RANK = 3         # os._exit in write_data of g4
OWN_FLOATS = 65_536     # a tensor only its rank holds: 256 KiB
EMB_SHAPE = (256, 1024)  # sharded by rows over the 4 ranks: 256 KiB each


# ---- what each rank runs (in its own process) ------------------------------------------------
def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _train(model: torch.nn.Module, optim: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)  # same data on every rank: replicated weights
    for _ in range(steps):
        optim.zero_grad()
        x = torch.randn(8, 16, generator=gen)
        model(x).pow(2).mean().backward()
        optim.step()


def _snapshot(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        if hasattr(obj, "to_local"):
            return obj.to_local().clone()
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_snapshot(v) for v in obj]
    return obj


def _same(a: Any, b: Any) -> bool:
    a, b = _snapshot(a), _snapshot(b)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


class _FailingWriter(EcstoreWriter):
    """A rank that dies after its objects are written, before the coordinator commits."""

    def __init__(self, *args: Any, fail: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fail = fail

    def write_data(self, plan: Any, planner: Any) -> Any:
        fut = super().write_data(plan, planner)
        if self.rank == FAILING_RANK and self.fail == "raise":
            raise RuntimeError(f"rank {self.rank} fails before the commit")
        if self.rank == KILLED_RANK and self.fail == "exit":
            os._exit(17)
        return fut


def _count_bytes(reader: EcstoreReader) -> list[int]:
    """Count the bytes the reader's gets of shard objects actually receive."""
    counted = [0]
    inner = reader.client.get_stream

    async def counting(bucket: str, key: str, *args: Any, **kw: Any) -> Any:
        async for part in inner(bucket, key, *args, **kw):
            counted[0] += len(part) if key.endswith(".distcp") else 0
            yield part
    reader.client.get_stream = counting  # type: ignore[method-assign]
    return counted


def rank_main(rank: int, port: int, cluster: str, out_dir: str) -> None:
    import datetime

    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (WORLD,))
    report: dict[str, Any] = {"rank": rank}

    def done() -> None:
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(report))

    def full_state(model: torch.nn.Module, optim: torch.optim.Optimizer, emb: Any,
                   own: torch.Tensor) -> dict[str, Any]:
        msd, osd = get_state_dict(model, optim)
        return {"model": msd, "optim": osd, "emb": emb, f"own.{rank}": own}

    def fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, Any]]:
        torch.manual_seed(1000 + rank)
        model = _model()
        optim = torch.optim.Adam(model.parameters(), lr=0.01)
        emb = distribute_tensor(torch.zeros(EMB_SHAPE), mesh, [Shard(0)])
        return model, optim, full_state(model, optim, emb, torch.zeros(OWN_FLOATS))

    def load(state: dict[str, Any], **kw: Any) -> tuple[list[int], EcstoreReader]:
        with EcstoreReader(cluster, BUCKET, PREFIX, **kw) as reader:
            counted = _count_bytes(reader)
            dcp.load(state, storage_reader=reader)
        return counted, reader

    torch.manual_seed(0)
    model = _model()
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    _train(model, optim, 3, seed=7)
    emb = distribute_tensor(torch.randn(EMB_SHAPE, generator=torch.Generator().manual_seed(3)),
                            mesh, [Shard(0)])
    own = torch.randn(OWN_FLOATS, generator=torch.Generator().manual_seed(100 + rank))
    state = full_state(model, optim, emb, own)
    with EcstoreWriter(cluster, BUCKET, PREFIX, "g1") as writer:
        dcp.save(state, storage_writer=writer)
    expected_g1 = _snapshot(state)

    # 1. a fresh model and optimizer get every tensor back
    model2, optim2, state2 = fresh()
    counted, reader = load(state2)
    set_state_dict(model2, optim2, model_state_dict=state2["model"], optim_state_dict=state2["optim"])
    report["round_trip"] = _same(full_state(model2, optim2, state2["emb"], state2[f"own.{rank}"]), expected_g1)
    report["loaded_generation"] = reader.generation
    report["full_load"] = {"requested": reader.stats.bytes_requested, "counted": counted[0]}

    # 2. a rank that needs only its shard and its own tensor reads only those bytes
    _, _, state3 = fresh()
    part = {"emb": state3["emb"], f"own.{rank}": state3[f"own.{rank}"]}
    counted, reader = load(part, max_gap_bytes=0)
    report["partial_load"] = {"requested": reader.stats.bytes_requested, "needed": reader.stats.bytes_needed,
                              "counted": counted[0], "ok": _same(part["emb"], expected_g1["emb"])
                              and _same(part[f"own.{rank}"], own)}

    # 3. a rank fails before the commit: g2 stays invisible, g1 stays latest
    _train(model, optim, 1, seed=8)
    with _FailingWriter(cluster, BUCKET, PREFIX, "g2", fail="raise") as failing:
        try:
            dcp.save(full_state(model, optim, emb, own), storage_writer=failing)
            report["failed_save_raised"] = False
        except CheckpointException as exc:  # a BaseException
            report["failed_save_raised"] = f"rank {FAILING_RANK} fails" in str(exc)
    model4, optim4, state4 = fresh()
    _, reader = load(state4)
    set_state_dict(model4, optim4, model_state_dict=state4["model"], optim_state_dict=state4["optim"])
    report["after_failure"] = {"generation": reader.generation, "ok": _same(
        full_state(model4, optim4, state4["emb"], state4[f"own.{rank}"]), expected_g1)}

    # 4. g3 commits (an auto-named writer would too); then rank 3 is killed saving g4
    with EcstoreWriter(cluster, BUCKET, PREFIX, "g3") as writer:
        dcp.save(full_state(model, optim, emb, own), storage_writer=writer)
    full_emb = emb.full_tensor()
    if rank == 0:
        torch.save({"model": _snapshot(model.state_dict()), "emb": full_emb}, Path(out_dir) / "g3.pt")
    report["killed_save"] = "not finished"
    done()
    _train(model, optim, 1, seed=9)
    with _FailingWriter(cluster, BUCKET, PREFIX, "g4", fail="exit") as failing:
        try:
            dcp.save(full_state(model, optim, emb, own), storage_writer=failing)
            report["killed_save"] = "no error"
        except BaseException as exc:  # gloo's error, or DCP's CheckpointException
            report["killed_save"] = type(exc).__name__
    done()
    os._exit(0)  # the process group lost a member: do not wait for it at exit


def _run_ranks(cluster: LocalCluster, out_dir: Path) -> dict[int, dict[str, Any]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(WORLD):
        code = (f"from tests.cluster.test_dcp import rank_main; "
                f"rank_main({rank}, {port}, {str(cluster.path)!r}, {str(out_dir)!r})")
        log = open(out_dir / f"rank{rank}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        log.close()
    deadline = time.monotonic() + RANKS_TIMEOUT_S
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        logs = "\n".join((out_dir / f"rank{r}.log").read_text()[-2000:] for r in range(WORLD))
        raise AssertionError(f"ranks did not finish in {RANKS_TIMEOUT_S}s:\n{logs}") from None
    reports = {}
    for rank in range(WORLD):
        path = out_dir / f"rank{rank}.json"
        assert path.exists(), (out_dir / f"rank{rank}.log").read_text()[-3000:]
        reports[rank] = json.loads(path.read_text())
    return reports


@pytest.fixture(scope="module")
def ranks(cluster: LocalCluster, client: SyncClient, tmp_path_factory: pytest.TempPathFactory
          ) -> dict[int, dict[str, Any]]:
    client.create_bucket(BUCKET)
    return _run_ranks(cluster, tmp_path_factory.mktemp("dcp"))


@pytest.fixture
def checkpoints(cluster: LocalCluster) -> Iterator[Checkpoints]:
    with Checkpoints(cluster.path, BUCKET, PREFIX) as cp:
        yield cp


def _keys_in(client: SyncClient, bucket: str, prefix: str) -> list[str]:
    return [o.key for o in client.list(bucket, prefix=prefix, max_keys=10_000).objects]


def _keys(client: SyncClient, prefix: str) -> list[str]:
    return _keys_in(client, BUCKET, prefix)


def _generation(cp: Checkpoints, name: str) -> Generation:
    return next(g for g in cp.generations() if g.name == name)


# ---- the four ranks ---------------------------------------------------------------------------
def test_four_ranks_save_and_load_model_and_optimizer(ranks: dict[int, dict[str, Any]]) -> None:
    for rank, rep in ranks.items():
        assert rep["round_trip"], f"rank {rank} loaded different tensors"
        assert rep["loaded_generation"] == "g1"
        assert rep["full_load"]["counted"] == rep["full_load"]["requested"] > 0


def test_load_reads_only_the_bytes_a_rank_needs(ranks: dict[int, dict[str, Any]],
                                                checkpoints: Checkpoints) -> None:
    stored = _generation(checkpoints, "g1").size_bytes
    for rank, rep in ranks.items():
        part, full = rep["partial_load"], rep["full_load"]
        assert part["ok"], f"rank {rank}"
        assert part["counted"] == part["requested"] == part["needed"], part
        # its 256 KiB shard of the embedding and its own 256 KiB tensor, of about 2 MiB
        assert 512 * 1024 < part["requested"] < 600 * 1024, part
        assert part["requested"] < stored / 3
        # everything: the replicated model and optimizer too, still not the other ranks' data
        assert part["requested"] < full["requested"] < stored * 0.6, (full, stored)


def test_a_rank_failing_before_the_commit_leaves_the_previous_generation_latest(
        ranks: dict[int, dict[str, Any]], checkpoints: Checkpoints) -> None:
    for rank, rep in ranks.items():
        assert rep["failed_save_raised"], f"rank {rank} did not see the failure"
        assert rep["after_failure"] == {"generation": "g1", "ok": True}, f"rank {rank}"
    g2 = _generation(checkpoints, "g2")
    assert not g2.complete and g2.objects >= WORLD  # every rank wrote; nothing committed


def test_a_killed_rank_leaves_the_previous_generation_latest_and_loadable(
        ranks: dict[int, dict[str, Any]], checkpoints: Checkpoints, cluster: LocalCluster,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    for rank, rep in ranks.items():
        if rank != KILLED_RANK:
            assert rep["killed_save"] not in ("not finished", "no error"), rep
    assert checkpoints.latest() == "g3"
    assert not _generation(checkpoints, "g4").complete
    expected = torch.load(next(tmp_path_factory.getbasetemp().glob("dcp*/g3.pt")), weights_only=True)
    state = {"model": {k: torch.zeros_like(v) for k, v in expected["model"].items()},
             "emb": torch.zeros(EMB_SHAPE)}  # one process, the sharded tensor as a whole
    with EcstoreReader(cluster.path, BUCKET, PREFIX) as reader:
        dcp.load(state, storage_reader=reader, no_dist=True)
    assert reader.generation == "g3"
    assert _same(state, expected)


def test_prune_removes_every_object_of_old_generations(
        ranks: dict[int, dict[str, Any]], checkpoints: Checkpoints, client: SyncClient) -> None:
    assert [g.name for g in checkpoints.generations()] == ["g1", "g2", "g3", "g4"]
    assert _keys(client, f"{PREFIX}/g1/") and _keys(client, f"{PREFIX}/g2/")
    # g4 failed after g3's commit: it could be a save in flight, so prune leaves it; g2
    # failed before it, but not an hour ago (a save in flight looks the same while a slow
    # rank writes and another save commits): left too, until failed_after_s says
    assert checkpoints.prune(keep=1) == ["g1"]
    assert checkpoints.prune(keep=1, failed_after_s=0) == ["g2"]
    assert _keys(client, f"{PREFIX}/g1/") == [] and _keys(client, f"{PREFIX}/g2/") == []
    assert [g.name for g in checkpoints.generations()] == ["g3", "g4"]
    with pytest.raises(Conflict):
        checkpoints.delete("g3")  # the latest
    g4 = _generation(checkpoints, "g4")
    assert checkpoints.delete("g4") == g4.objects
    assert _keys(client, f"{PREFIX}/g4/") == []
    assert checkpoints.latest() == "g3" and _generation(checkpoints, "g3").complete


# ---- one process ---------------------------------------------------------------------------------
def test_saving_over_a_complete_generation_is_refused_unless_overwrite(
        cluster: LocalCluster, client: SyncClient) -> None:
    client.create_bucket("ckpt-solo")
    with EcstoreWriter(cluster.path, "ckpt-solo", "p", "a") as writer:
        dcp.save({"w": torch.ones(4)}, storage_writer=writer, no_dist=True)
    with EcstoreWriter(cluster.path, "ckpt-solo", "p", "a") as writer:
        with pytest.raises(CheckpointException, match="exists"):
            dcp.save({"w": torch.zeros(4)}, storage_writer=writer, no_dist=True)
    with EcstoreWriter(cluster.path, "ckpt-solo", "p", "a", overwrite=True) as writer:
        dcp.save({"w": torch.full((4,), 2.0)}, storage_writer=writer, no_dist=True)
    with EcstoreWriter(cluster.path, "ckpt-solo", "p") as writer:  # the coordinator names it
        dcp.save({"w": torch.full((4,), 3.0)}, storage_writer=writer, no_dist=True)
        auto = writer.generation
    assert auto is not None and re.fullmatch(r"\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{6}", auto), auto
    for gen, value in (("a", 2.0), (None, 3.0)):
        state = {"w": torch.zeros(4)}
        with EcstoreReader(cluster.path, "ckpt-solo", "p", gen) as reader:
            dcp.load(state, storage_reader=reader, no_dist=True)
        assert torch.equal(state["w"], torch.full((4,), value))
    # each save wrote shard objects of its own (a token in their names): the first save
    # of "a" and the overwrite never shared one, so no load can mix two saves' bytes
    shards = [o.key for o in client.list("ckpt-solo", prefix="p/a/").objects
              if o.key.endswith(".distcp")]
    tokens = {re.fullmatch(r"p/a/__0_([0-9a-f]{8})_\d+\.distcp", k)[1] for k in shards}  # type: ignore[index]
    assert len(tokens) == 2, shards


def test_a_save_writes_every_shard_uncached_unless_cache_writes(cluster: LocalCluster,
                                                                client: SyncClient) -> None:
    """EcstoreWriter by default: each shard object's fragments are written uncached on
    their storage nodes (x-ecstore-uncached); cache_writes=True writes them as any object.
    Both load back."""
    skip_unless_uncached_writes()
    client.create_bucket("ckpt-uncached")
    state = {"w": torch.arange(3 << 20, dtype=torch.float32)}   # 12 MiB: 3 segments
    before = uncached_writes(cluster)
    with EcstoreWriter(cluster.path, "ckpt-uncached", "p", "plain", objects_per_rank=1,
                       cache_writes=True) as writer:
        dcp.save(state, storage_writer=writer, no_dist=True)
    assert uncached_writes(cluster) == before
    with EcstoreWriter(cluster.path, "ckpt-uncached", "p", "cold", objects_per_rank=1) as writer:
        dcp.save(state, storage_writer=writer, no_dist=True)
    # the shard's segments (k + m fragments each); .metadata and latest are small, inline
    assert uncached_writes(cluster) - before >= 3 * 6
    for gen in ("plain", "cold"):
        got = {"w": torch.zeros(3 << 20, dtype=torch.float32)}
        with EcstoreReader(cluster.path, "ckpt-uncached", "p", gen) as reader:
            dcp.load(got, storage_reader=reader, no_dist=True)
        assert torch.equal(got["w"], state["w"])


def _dcp_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "ecstore-dcp" and t.is_alive())


def test_writers_and_readers_dropped_without_close_free_their_threads(
        cluster: LocalCluster, client: SyncClient) -> None:
    """`dcp.save(state, storage_writer=EcstoreWriter(...))` never closes its writer: each
    such save kept an event-loop thread for ever, and its connections until the nodes'
    idle timeout (10 saves: 11 threads, 236 fds, in an ML sweep)."""
    client.create_bucket("ckpt-dropped")
    state = {"w": torch.arange(1 << 16, dtype=torch.float32)}
    before = _dcp_threads()
    for i in range(3):
        dcp.save(state, no_dist=True, storage_writer=EcstoreWriter(
            cluster.path, "ckpt-dropped", "p", f"g{i}", objects_per_rank=1))
    got = {"w": torch.zeros(1 << 16, dtype=torch.float32)}
    dcp.load(got, no_dist=True, storage_reader=EcstoreReader(cluster.path, "ckpt-dropped", "p", "g2"))
    assert torch.equal(got["w"], state["w"])
    deadline = time.monotonic() + 20
    while _dcp_threads() > before and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.1)
    assert _dcp_threads() == before


def test_a_save_whose_shards_were_deleted_meanwhile_is_not_committed(
        cluster: LocalCluster, client: SyncClient) -> None:
    """A prune that took a save in flight for a failed one deleted its finished ranks'
    shards, and the save's commit then made it `latest`, every load failing NotFound. The
    commit checks its shards are there: it fails, nothing committed, latest unchanged."""
    client.create_bucket("ckpt-gone")
    with EcstoreWriter(cluster.path, "ckpt-gone", "p", "step-1") as writer:
        dcp.save({"w": torch.ones(4)}, storage_writer=writer, no_dist=True)

    class Pruned(EcstoreWriter):
        def finish(self, metadata: Any, results: Any) -> None:
            for o in client.list("ckpt-gone", prefix="p/step-2/").objects:
                client.delete("ckpt-gone", o.key)     # as such a prune did
            super().finish(metadata, results)
    with Pruned(cluster.path, "ckpt-gone", "p", "step-2") as writer:
        with pytest.raises(CheckpointException, match="are gone"):
            dcp.save({"w": torch.zeros(4)}, storage_writer=writer, no_dist=True)
    with Checkpoints(cluster.path, "ckpt-gone", "p") as ck:
        assert ck.latest() == "step-1"
        assert [(g.name, g.complete) for g in ck.generations()] == [("step-1", True)]
    state = {"w": torch.zeros(4)}
    with EcstoreReader(cluster.path, "ckpt-gone", "p") as reader:
        dcp.load(state, storage_reader=reader, no_dist=True)
    assert torch.equal(state["w"], torch.ones(4))


def test_a_misspelled_bucket_or_a_closed_handle_says_so(cluster: LocalCluster,
                                                       client: SyncClient) -> None:
    """latest() of a bucket that does not exist is NotFound (it was None: a restart
    script started training over); a writer, reader or Checkpoints used after close()
    raises ClientClosed (it was RuntimeError('Event loop is closed') and never-awaited
    coroutine warnings)."""
    import warnings

    from store.errors import ClientClosed, NotFound
    with Checkpoints(cluster.path, "ckpt-no-such-bucket", "p") as ck:
        with pytest.raises(NotFound, match="no such bucket"):
            ck.latest()
    client.create_bucket("ckpt-closed")
    with Checkpoints(cluster.path, "ckpt-closed", "p") as ck:
        assert ck.latest() is None                  # a bucket with no save yet
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # no never-awaited coroutine
        with pytest.raises(ClientClosed):
            ck.latest()
        writer = EcstoreWriter(cluster.path, "ckpt-closed", "p", "g")
        writer.close()
        with pytest.raises(CheckpointException, match="closed"):
            dcp.save({"w": torch.ones(2)}, storage_writer=writer, no_dist=True)
        gc.collect()
    assert client.list("ckpt-closed").objects == []


def test_a_load_missing_its_shards_fails_once_and_logs_no_stray_task_errors(
        cluster: LocalCluster, client: SyncClient, caplog: pytest.LogCaptureFixture) -> None:
    """Every shard object deleted under a complete generation: the load fails (NotFound),
    and the record lookups of the other objects, left when the first failure ended the
    load, no longer log "Task exception was never retrieved" when collected."""
    import logging
    client.create_bucket("ckpt-holes")
    state = {f"t{i}": torch.full((1000,), float(i)) for i in range(8)}
    with EcstoreWriter(cluster.path, "ckpt-holes", "p", "g", objects_per_rank=4) as writer:
        dcp.save(state, storage_writer=writer, no_dist=True)
    shards = [o.key for o in client.list("ckpt-holes", prefix="p/g/").objects
              if o.key.endswith(".distcp")]
    assert len(shards) == 4
    for key in shards:
        client.delete("ckpt-holes", key)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with EcstoreReader(cluster.path, "ckpt-holes", "p") as reader:
            with pytest.raises(CheckpointException, match="no such object"):
                dcp.load({k: torch.zeros(1000) for k in state}, storage_reader=reader,
                         no_dist=True)
        gc.collect()
    assert "never retrieved" not in caplog.text, caplog.text


def test_a_save_whose_serialization_fails_commits_nothing(cluster: LocalCluster, client: SyncClient) -> None:
    client.create_bucket("ckpt-bad")
    state = {"w": torch.ones(3 << 20), "bad": lambda: 0}  # the lambda cannot be pickled
    with EcstoreWriter(cluster.path, "ckpt-bad", "p", "x", objects_per_rank=1) as writer:
        with pytest.raises(CheckpointException):
            dcp.save(state, storage_writer=writer, no_dist=True)
    assert client.list("ckpt-bad").objects == []


def test_a_generation_copied_to_a_directory_loads_with_filesystem_reader(
        cluster: LocalCluster, client: SyncClient, tmp_path: Path) -> None:
    client.create_bucket("ckpt-fs")
    state = {"w": torch.arange(10_000, dtype=torch.float64), "meta": {"step": 7}}
    with EcstoreWriter(cluster.path, "ckpt-fs", "p", "g") as writer:
        dcp.save(state, storage_writer=writer, no_dist=True)
    for key in _keys_in(client, "ckpt-fs", "p/g/"):
        (tmp_path / key.rsplit("/", 1)[1]).write_bytes(client.get("ckpt-fs", key))
    loaded = {"w": torch.zeros(10_000, dtype=torch.float64), "meta": {"step": 0}}
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(tmp_path), no_dist=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["meta"] == {"step": 7}


def test_ranks_that_resolved_latest_differently_are_refused(cluster: LocalCluster) -> None:
    from torch.distributed.checkpoint.planner import LoadPlan

    from store.dcp import _LoadPlanData
    with EcstoreReader(cluster.path, BUCKET, PREFIX) as reader:
        plans = [LoadPlan([], storage_data=_LoadPlanData(g)) for g in ("g3", "g3", "g4")]
        with pytest.raises(BadRequest, match="different generations"):
            reader.prepare_global_plan(plans)
        assert reader.prepare_global_plan(plans[:2]) == plans[:2]


# ---- pure planning against naive models -------------------------------------------------------------
def test_range_reads_cover_every_request_exactly_once_and_respect_the_limits() -> None:
    rng = random.Random(5)
    for _ in range(300):
        reqs = [(rng.choice("ab"), rng.randrange(0, 5000), rng.randrange(1, 400)) for _ in range(rng.randrange(1, 30))]
        gap, cap = rng.choice([0, 10, 300]), rng.choice([500, 2000, 10**6])
        reads = plan_range_reads(reqs, gap, cap)
        seen = sorted(i for r in reads for i, _, _ in r.members)
        assert seen == list(range(len(reqs)))
        for r in reads:
            for i, off, length in r.members:
                name, start, n = reqs[i]
                assert (r.name, r.start + off, length) == (name, start, n)
                assert 0 <= off and off + length <= r.stop - r.start
            assert r.stop - r.start <= max(cap, max(reqs[i][2] for i, _, _ in r.members))
            # no byte read that no member needs, beyond holes of at most `gap`
            covered = sorted((off, off + n) for _, off, n in r.members)
            end = 0
            for lo, hi in covered:
                assert lo - end <= gap
                end = max(end, hi)
        if gap == 0 and cap == 10**6:  # only touching or overlapping requests share a read
            by_name: dict[str, list[tuple[int, int]]] = {}
            for name, start, n in reqs:
                by_name.setdefault(name, []).append((start, start + n))
            naive = 0
            for spans in by_name.values():
                end = -1
                for lo, hi in sorted(spans):
                    naive += lo > end
                    end = max(end, hi)
            assert len(reads) == naive


def test_split_by_size_balances_and_keeps_every_item() -> None:
    rng = random.Random(1)
    for _ in range(200):
        sizes = [rng.randrange(0, 1000) for _ in range(rng.randrange(1, 40))]
        bins = rng.randrange(1, 8)
        groups = split_by_size(sizes, bins)
        assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
        assert len(groups) == min(bins, len(sizes)) and all(g == sorted(g) for g in groups)
        loads = [sum(sizes[i] for i in g) for g in groups]
        assert max(loads) - min(loads) <= max(sizes)  # greedy: within one item
    # items of no bytes (BYTE_IO of nothing) went all to one group, leaving empty objects
    assert all(split_by_size([0] * 5, 4)) and len(split_by_size([0] * 5, 4)) == 4


def test_generations_group_a_listing_and_prune_keeps_latest_and_saves_in_flight() -> None:
    def e(key: str, ts: int, size: int = 10) -> ListEntry:
        return ListEntry(key, size, ts, "v")
    entries = [e("p/latest", 99), e("p/a/.metadata", 5), e("p/a/__0_0.distcp", 4),
               e("p/b/__0_0.distcp", 6), e("p/c/.metadata", 9), e("p/c/__0_0.distcp", 8),
               e("p/d/__0_0.distcp", 12), e("p/cd/.metadata", 7)]
    gens = group_generations(entries, "p")
    assert [(g.name, g.complete, g.objects) for g in gens] == [
        ("a", True, 2), ("b", False, 1), ("cd", True, 1), ("c", True, 2), ("d", False, 1)]
    assert choose_prune(gens, "c", keep=1) == ["a", "cd", "b"]
    assert choose_prune(gens, "a", keep=1) == ["cd", "b"]   # latest is kept whatever its age
    assert choose_prune(gens, "c", keep=5) == ["b"]         # d is newer than every commit
    # b is older than the newest commit but younger than failed_after_s: maybe in flight
    two_s_later = 6 + 2_000_000_000        # b's newest object at 6 ns
    assert choose_prune(gens, "c", keep=5, now_ns=two_s_later, failed_after_s=5) == []
    assert choose_prune(gens, "c", keep=5, now_ns=two_s_later, failed_after_s=1) == ["b"]
    names = [new_generation_name(t, "ab12cd") for t in (1_700_000_000_000_000_000, 1_700_000_000_000_001_000,
                                                         1_800_000_000_000_000_000)]
    assert names == sorted(names) and names[0] == "20231114T221320.000000Z-ab12cd"


def test_prune_deletes_only_what_saves_write_not_another_jobs_checkpoints() -> None:
    """Job B saves under exp/ablation/ (its own generations and latest): to job A pruning
    exp/, "ablation" looked like an incomplete generation older than A's newest commit -
    a failed save - and A deleted B's checkpoints. Only directories holding nothing but
    shard objects (and .metadata) are generations prune may delete."""
    def e(key: str, ts: int) -> ListEntry:
        return ListEntry(key, 10, ts, "v")
    entries = [e("exp/latest", 99), e("exp/step-1/.metadata", 5),
               e("exp/step-1/__0_ab12cd34_0.distcp", 4), e("exp/step-2/.metadata", 9),
               e("exp/step-2/__0_ab12cd34_0.distcp", 8),
               e("exp/ablation/latest", 3), e("exp/ablation/step-1/.metadata", 2),
               e("exp/ablation/step-1/__0_ff00ff00_0.distcp", 1),
               e("exp/failed/__0_01234567_0.distcp", 6), e("exp/notes/readme.txt", 1)]
    gens = group_generations(entries, "exp")
    assert {g.name: g.shards_only for g in gens} == {
        "step-1": True, "step-2": True, "ablation": False, "failed": True, "notes": False}
    assert sorted(choose_prune(gens, "step-2", keep=1)) == ["failed", "step-1"]

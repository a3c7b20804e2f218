"""docker-compose.yml without Docker: valid Compose, the issue's topology, and its
services' own commands run as local processes (see compose_local.py) make a cluster that
stores and returns objects; broken copies of the file must fail. The optional Prometheus
service (profile `monitoring`) scrapes every node, with the token the nodes accept.

`docker compose up` without `--profile` starts no service that has profiles: the topology
checks and the local run see the file that way (default_profile()).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.compose_local import (
    ROOT,
    SECRET_VARS,
    ComposeError,
    ComposeRun,
    Doc,
    argv_of,
    compose_up,
    flag,
    load_compose,
    read_env_file,
    role,
    schema_errors,
    service_env,
    topology_problems,
    unshared,
)

PROMETHEUS_CONFIG = ROOT / "docker" / "prometheus.yml"


def default_profile(doc: Doc) -> Doc:
    """The services `docker compose up` starts: those without profiles."""
    doc = unshared(doc)
    doc["services"] = {n: s for n, s in doc["services"].items() if not s.get("profiles")}
    return doc


def load_default() -> Doc:
    return default_profile(load_compose())


@pytest.fixture
def tmp_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="ecstore-compose-"))
    yield d
    if request.config.getoption("--keep-tmp"):
        print(f"\nkept {d}")
    else:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def compose_cluster(request: pytest.FixtureRequest) -> Iterator[ComposeRun]:
    d = Path(tempfile.mkdtemp(prefix="ecstore-compose-"))
    try:
        with compose_up(load_default(), d) as run:
            yield run
    finally:
        if request.config.getoption("--keep-tmp"):
            print(f"\nkept {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)


# ---- the file ---------------------------------------------------------------------------
def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    assert schema_errors(load_compose()) == []


@pytest.mark.parametrize("breakage, path", [
    (lambda d: d["services"]["storage1"].update(restart_policy="always"), "services/storage1"),
    (lambda d: d["services"]["gateway"].update(ports=9000), "services/gateway/ports"),
    (lambda d: d["services"]["control1"]["healthcheck"].update(interval=5),
     "services/control1/healthcheck/interval"),
    (lambda d: d.update(service={}), "(top)"),
])
def test_a_broken_copy_does_not_validate(breakage: Callable[[Doc], None], path: str) -> None:
    doc = unshared(load_compose())
    breakage(doc)
    assert any(e.startswith(path) for e in schema_errors(doc)), schema_errors(doc)


def test_topology_three_control_six_storage_a_gateway_and_a_oneshot_init() -> None:
    assert topology_problems(load_default()) == []


def _replace_in_command(service: str, old: str, new: str) -> Callable[[Doc], None]:
    def edit(d: Doc) -> None:
        cmd = d["services"][service]["command"]
        assert any(old in a for a in cmd), cmd
        d["services"][service]["command"] = [a.replace(old, new) for a in cmd]
    return edit


def _drop_control3(d: Doc) -> None:
    del d["services"]["control3"]


def _share_volume(d: Doc) -> None:
    d["services"]["storage2"]["volumes"] = ["storage1-data:/data"]


@pytest.mark.parametrize("breakage, problem", [
    (_drop_control3, "expected 3 control"),
    (_share_volume, "is also storage1's"),
    (lambda d: d["services"]["storage4"].pop("healthcheck"), "storage4: no python health check"),
    (lambda d: d["services"]["control2"].pop("restart"), "control2: no restart policy"),
    (lambda d: d["services"]["gateway"].pop("depends_on"), "depend on init"),
    (lambda d: d["services"]["init"].update(depends_on=["control1"]), "init must wait"),
    (lambda d: d["services"]["storage3"].update(
        environment={"ECSTORE_SECRET": "inline-secret-0123456789"}), "set inline"),
    (lambda d: d["services"]["storage5"].pop("env_file"), "storage5: its env_file"),
    (lambda d: d["services"]["storage6"].update(volumes=[]), "storage6: expected one named volume"),
    (lambda d: d["services"]["storage6"].update(command=["python", "-m", "node.storage", "--id",
                                                         "s6", "--port", "7200", "--data", "/data"]),
     "storage6: must listen on 0.0.0.0"),
    (_replace_in_command("storage2", "storage2", "s2"), "is not the --id of the service"),
    (lambda d: d["services"]["gateway"].update(ports=["127.0.0.1:9000:9001"]), "must publish its --port"),
])
def test_topology_check_catches(breakage: Callable[[Doc], Any], problem: str) -> None:
    doc = load_default()
    breakage(doc)
    assert any(problem in p for p in topology_problems(doc)), topology_problems(doc)


def test_env_file_holds_marked_demo_values() -> None:
    text = (ROOT / "docker" / "ecstore.env").read_text()
    env = read_env_file(ROOT / "docker" / "ecstore.env")
    assert set(SECRET_VARS) <= env.keys() and len(env["ECSTORE_SECRET"]) >= 16
    assert "DEMO VALUES" in text and "CHANGE" in text


def test_dockerfile_slim_non_root_and_commands_are_whole_argvs() -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    assert lines[[ln.startswith("FROM") for ln in lines].index(True)] == "FROM python:3.11-slim"
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert not any(ln.startswith("ENTRYPOINT") for ln in lines)  # command = argv
    assert any("pip install" in ln for ln in lines) and any("/data" in ln for ln in lines)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {ln.split()[1] for ln in lines if ln.startswith("COPY ")}
    assert {p.split(".")[0] for p in pyproject["tool"]["setuptools"]["packages"]} <= copied
    # the local run replaces `ecstore` with `python -m cli.main`: the same entry point
    # cli.entry: cli.main, with a Ctrl-C while it loads an exit 130, not a traceback
    assert pyproject["project"]["scripts"]["ecstore"] == "cli.entry:main"


# ---- the local run ----------------------------------------------------------------------
def _maps(run: ComposeRun) -> list[bytes | None]:
    from cli.localcluster import fetch_map
    secret = run.env["init"]["ECSTORE_SECRET"]
    return [fetch_map(secret, url) for url in run.urls("control")]


def test_init_installed_one_map_on_every_control_node(compose_cluster: ComposeRun) -> None:
    from placement.cluster_map import ClusterMap
    maps = _maps(compose_cluster)
    assert maps[0] is not None and maps.count(maps[0]) == 3
    cmap = ClusterMap.from_bytes(maps[0])
    assert cmap.epoch == 1 and [(p.k, p.m) for p in cmap.policies] == [(4, 2)]
    assert sorted(n.address for n in cmap.all_storage_nodes()) == sorted(compose_cluster.urls("storage"))
    assert sorted(n.id for n in cmap.control.nodes) == ["control1", "control2", "control3"]


def _payloads() -> dict[str, bytes]:
    return {"small.txt": b"hello from compose", "dir/1k.bin": os.urandom(1024),
            "ckpt/5mib.bin": os.urandom(5 * 1024 * 1024 + 3)}


def test_put_and_get_with_the_client_library(compose_cluster: ComposeRun) -> None:
    from store.client import SyncClient
    from store.cluster import ClusterInfo

    info = ClusterInfo(tuple(compose_cluster.urls("control")), compose_cluster.env["init"]["ECSTORE_SECRET"])
    with SyncClient(info) as c:
        c.create_bucket("compose-lib")
        stored = _payloads()
        for key, data in stored.items():
            c.put("compose-lib", key, data)
        for key, data in stored.items():
            assert c.get("compose-lib", key) == data, key


def test_put_and_get_through_the_s3_gateway_with_boto3(compose_cluster: ComposeRun) -> None:
    import boto3

    env = compose_cluster.env["gateway"]
    s3 = boto3.client("s3", endpoint_url=compose_cluster.endpoint("gateway"), region_name="us-east-1",
                      aws_access_key_id=env["ECSTORE_S3_ACCESS_KEY"],
                      aws_secret_access_key=env["ECSTORE_S3_SECRET_KEY"])
    s3.create_bucket(Bucket="compose-s3")
    stored = _payloads()
    for key, data in stored.items():
        s3.put_object(Bucket="compose-s3", Key=key, Body=data)
    for key, data in stored.items():
        assert s3.get_object(Bucket="compose-s3", Key=key)["Body"].read() == data, key
    listed = s3.list_objects_v2(Bucket="compose-s3")["Contents"]
    assert sorted(o["Key"] for o in listed) == sorted(stored)


def test_every_node_says_it_runs_with_the_published_demo_secrets(compose_cluster: ComposeRun
                                                                  ) -> None:
    # docker/ecstore.env's values are in the repository: whoever read it holds the
    # cluster's keys and the S3 admin's (a security review); each node says so at start
    for name in ("control1", "storage1", "gateway"):
        said = [ln for ln in compose_cluster.log(name).read_text(errors="replace").splitlines()
                if "demo secret" in ln]
        assert said and "WARNING" in said[0], name
    gateway = compose_cluster.log("gateway").read_text(errors="replace")
    assert "ECSTORE_S3_SECRET_KEY" in gateway and "ECSTORE_SECRET" in gateway


def test_status_in_a_container_shows_every_node_and_the_gateway(compose_cluster: ComposeRun,
                                                                tmp_path: Path) -> None:
    """`docker compose exec control1 ecstore status`: the cluster from the container's
    environment (no cluster.json), the gateway's row from ECSTORE_GATEWAY (it had none)."""
    proc = subprocess.run([sys.executable, "-m", "cli.main", "status", "--json"], cwd=tmp_path,
                          env=compose_cluster.process_env("control1"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["id"]: (r["role"], r["state"]) for r in json.loads(proc.stdout)["nodes"]}
    assert rows["gateway"] == ("gateway", "up")
    assert sorted(r for r, _ in rows.values()) == ["control"] * 3 + ["gateway"] + ["storage"] * 6


def test_rerunning_init_is_idempotent(compose_cluster: ComposeRun) -> None:
    before = _maps(compose_cluster)
    compose_cluster.completed.discard("init")
    compose_cluster.run_oneshot("init")
    assert _maps(compose_cluster) == before
    assert "nothing to do" in compose_cluster.tail("init")


# ---- a compose file with a broken topology fails the run -------------------------------
def _remove_storage5_and_6(d: Doc) -> None:
    for name in ("storage5", "storage6"):
        del d["services"][name], d["volumes"][f"{name}-data"], \
            d["services"]["init"]["depends_on"][name]
    cmd = d["services"]["init"]["command"]
    i = cmd.index("--storage") + 1
    cmd[i] = ",".join(s for s in cmd[i].split(",") if "storage5" not in s and "storage6" not in s)


@pytest.mark.parametrize("breakage, error", [
    (_remove_storage5_and_6, "init exited with 2"),
    (lambda d: d["services"]["storage3"].pop("env_file"), "storage3 exited"),
    (lambda d: d["services"]["init"].update(environment={"ECSTORE_SECRET": "not-the-nodes-secret"}),
     "not the one the nodes were started with"),
    (lambda d: d["services"]["gateway"].update(ports=["127.0.0.1:9000:9001"]),
     "gateway publishes port 9001"),
    (_replace_in_command("gateway", "http://control2:7100", "http://control2:7101"),
     "gateway refers to http://control2:7101"),
    (_replace_in_command("control1", "7100", "7101"), "init refers to http://control1:7100"),
    (_replace_in_command("init", "storage6=http://storage6:7200",
                         "storage6=http://storage6:7200,storage7=http://storage7:7200"),
     "no service 'storage7'"),
    (lambda d: d["services"]["storage3"].update(
        environment={"ECSTORE_SECRET": "another-secret-for-storage3-only"}),
     "storage node storage3 (http://127.0.0.1"),    # the local run's address

    (_replace_in_command("init", "storage1=http://storage1:7200,storage2=http://storage2:7200",
                         "storage1=http://storage2:7200,storage2=http://storage1:7200"),
     "answers as storage node storage2, not as storage node storage1"),
], ids=["4+2 on four storage nodes", "a node without the secret", "init with another secret",
        "gateway port not published", "gateway asks a wrong control port",
        "control node moved port", "unknown storage node", "a storage node with another secret",
        "two storage URLs swapped"])
def test_a_broken_topology_fails_the_run(breakage: Callable[[Doc], Any], error: str,
                                         tmp_dir: Path) -> None:
    doc = load_default()
    breakage(doc)
    with pytest.raises(ComposeError) as failed:
        with compose_up(doc, tmp_dir) as run:
            run.endpoint("gateway")
    assert error in " ".join(str(failed.value).split())  # a log line may be wrapped


# ---- the monitoring profile: Prometheus ---------------------------------------------------
def node_targets(doc: Doc) -> dict[str, tuple[str, str]]:
    """{"service:port": (role, metrics path)} of every node service of the default profile."""
    out = {}
    for name, svc in default_profile(doc)["services"].items():
        kind = role(svc)
        if kind in ("control", "storage", "gateway"):
            port = flag(argv_of(svc.get("command")), "--port")
            out[f"{name}:{port}"] = (kind, "/_ecstore/metrics" if kind == "gateway" else "/metrics")
    return out


def scrape_targets(config: Doc) -> dict[str, tuple[str, str]]:
    """{"host:port": (metrics path, bearer token)} of a Prometheus config's static targets."""
    out = {}
    for job in config.get("scrape_configs") or []:
        token = (job.get("authorization") or {}).get("credentials", "")
        for group in job.get("static_configs") or []:
            for target in group.get("targets") or []:
                out[target] = (job.get("metrics_path", "/metrics"), token)
    return out


def prometheus_problems(doc: Doc, config: Doc) -> list[str]:
    """What keeps the monitoring profile from scraping every node: its service (profile
    monitoring, prom/prometheus, this config mounted, data in a volume, UI on loopback),
    and a target with the right path and the nodes' token for every node."""
    svc = doc["services"].get("prometheus")
    if svc is None:
        return ["no prometheus service"]
    problems = []
    if svc.get("profiles") != ["monitoring"]:
        problems.append(f"prometheus: profiles {svc.get('profiles')}, expected [monitoring]")
    if not str(svc.get("image", "")).startswith("prom/prometheus:"):
        problems.append(f"prometheus: image {svc.get('image')!r} is not a pinned prom/prometheus")
    if "./docker/prometheus.yml:/etc/prometheus/prometheus.yml:ro" not in (svc.get("volumes") or []):
        problems.append("prometheus: docker/prometheus.yml is not mounted read-only as its config")
    if any(not str(p).startswith("127.0.0.1:") for p in svc.get("ports") or []):
        problems.append("prometheus: publish its port on 127.0.0.1 only")
    targets = scrape_targets(config)
    for target, (kind, path) in node_targets(doc).items():
        name = target.split(":")[0]
        token = service_env(doc["services"][name]).get("ECSTORE_METRICS_TOKEN", "")
        if target not in targets:
            problems.append(f"no scrape target {target} ({kind})")
        elif targets[target] != (path, token) or len(token) < 16:
            problems.append(f"{target}: scraped at {targets[target][0]} with another token "
                            f"than the node's ECSTORE_METRICS_TOKEN (expected {path})")
    for target in set(targets) - set(node_targets(doc)):
        problems.append(f"scrape target {target} is no node of the compose file")
    return problems


def load_prometheus_config() -> Doc:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert isinstance(config, dict)
    return config


def test_monitoring_profile_prometheus_scrapes_every_node_with_their_token() -> None:
    assert prometheus_problems(load_compose(), load_prometheus_config()) == []


def _drop_target(target: str) -> Callable[[Doc, Doc], None]:
    def edit(_doc: Doc, config: Doc) -> None:
        for job in config["scrape_configs"]:
            for group in job["static_configs"]:
                group["targets"] = [t for t in group["targets"] if t != target]
    return edit


def _token_of(service: str, token: str) -> Callable[[Doc, Doc], None]:
    def edit(doc: Doc, _config: Doc) -> None:
        doc["services"][service]["environment"] = {
            **doc["services"][service].get("environment", {}), "ECSTORE_METRICS_TOKEN": token}
    return edit


@pytest.mark.parametrize("breakage, problem", [
    (_drop_target("storage6:7200"), "no scrape target storage6:7200"),
    (_token_of("control2", "another-token-0123456789"), "control2:7100: scraped at"),
    (lambda d, c: c["scrape_configs"][2].pop("metrics_path"), "gateway:9000: scraped at"),
    (lambda d, c: d["services"]["prometheus"].pop("profiles"), "profiles None"),
    (lambda d, c: c["scrape_configs"][0]["static_configs"][0]["targets"].append("control4:7100"),
     "control4:7100 is no node"),
])
def test_prometheus_check_catches(breakage: Callable[[Doc, Doc], None], problem: str) -> None:
    doc, config = unshared(load_compose()), load_prometheus_config()
    breakage(doc, config)
    assert any(problem in p for p in prometheus_problems(doc, config)), prometheus_problems(doc, config)


def test_every_scrape_target_answers_in_the_local_run(compose_cluster: ComposeRun) -> None:
    """Prometheus' view, without Prometheus: each target of docker/prometheus.yml, mapped
    to its local process, answers its metrics path with the config's bearer token."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    for target, (path, token) in scrape_targets(load_prometheus_config()).items():
        host, port = target.split(":")
        url = f"http://127.0.0.1:{compose_cluster.ports[(host, int(port))]}{path}"
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            families = {f.name for f in text_string_to_metric_families(r.read().decode())}
        assert "ecstore_http_requests" in families and "ecstore_node_info" in families, target

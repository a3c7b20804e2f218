"""Reading docker-compose.yml and running its services as local processes (for
tests/cluster/test_compose.py). docker-compose.yml without Docker: it is valid Compose, it has the topology of the
issue, and its services' own commands, run as local processes on 127.0.0.1, make a
cluster that stores and returns objects (through the S3 gateway and the client library).

The local run maps every (service, port) to a free loopback port and rewrites commands,
environment and health checks the way Docker's network and volumes would resolve them:
`--host 0.0.0.0` -> 127.0.0.1, `--port N` -> the mapped port, `http://SERVICE:N` and a
health check's `http://127.0.0.1:N` -> the mapped port, a volume's mount point -> a
per-volume temporary directory. A reference to a port no service listens on fails at
once, as would a container that exits or never turns healthy, or a one-shot that fails.

The schema, tests/data/compose-spec.json, is the Compose Specification's JSON schema as
shipped in the npm package dclint 3.1.0 (file schemas/compose.schema.json); see
tests/data/README.md.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
SCHEMA_FILE = ROOT / "tests" / "data" / "compose-spec.json"
HEALTH_TIMEOUT_S = 30.0
HEALTH_CHECK_TIMEOUT_S = 10.0
ONESHOT_TIMEOUT_S = 45.0
STOP_TIMEOUT_S = 5.0
LOG_TAIL_BYTES = 3000
NODE_MODULES = {"node.control": "control", "node.storage": "storage", "node.gateway": "gateway"}
SECRET_VARS = ("ECSTORE_SECRET", "ECSTORE_S3_ACCESS_KEY", "ECSTORE_S3_SECRET_KEY")
URL_RE = re.compile(r"http://([A-Za-z0-9_.-]+):(\d+)")
LOOPBACK = {"127.0.0.1", "localhost", "0.0.0.0"}

Doc = dict[str, Any]


class ComposeError(Exception):
    """The compose file does not give a working cluster when run locally."""


# ---- reading the compose file -----------------------------------------------------------
def load_compose(path: Path = COMPOSE_FILE) -> Doc:
    doc = yaml.safe_load(path.read_text())  # resolves anchors and `<<` merge keys
    assert isinstance(doc, dict)
    return doc


def unshared(doc: Doc) -> Doc:
    """A copy with no objects shared between services (anchors make PyYAML share them)."""
    return json.loads(json.dumps(doc))


def schema_errors(doc: Doc) -> list[str]:
    schema = json.loads(SCHEMA_FILE.read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in validator.iter_errors(doc)]


def argv_of(value: Any) -> list[str]:
    """A command, entrypoint or health-check test as an argv list."""
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def role(svc: dict[str, Any]) -> str:
    argv = argv_of(svc.get("command"))
    if argv[:2] == ["python", "-m"] and len(argv) > 2:
        return NODE_MODULES.get(argv[2], "other")
    return "init" if argv[:3] == ["ecstore", "cluster", "bootstrap"] else "other"


def env_file_paths(svc: dict[str, Any]) -> list[str]:
    files = svc.get("env_file") or []
    files = [files] if isinstance(files, (str, dict)) else files
    return [f["path"] if isinstance(f, dict) else f for f in files]


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def service_env(svc: dict[str, Any]) -> dict[str, str]:
    """env_file entries, then `environment` on top (Compose's precedence)."""
    env: dict[str, str] = {}
    for f in env_file_paths(svc):
        env.update(read_env_file(COMPOSE_FILE.parent / f))
    extra = svc.get("environment") or {}
    if isinstance(extra, list):
        extra = dict(e.partition("=")[::2] for e in extra)
    env.update({k: "" if v is None else str(v) for k, v in extra.items()})
    return env


def depends_on(svc: dict[str, Any]) -> dict[str, str]:
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {d: (c or {}).get("condition", "service_started") for d, c in deps.items()}


def named_volumes(doc: Doc, svc: dict[str, Any]) -> dict[str, str]:
    """{mount point: named volume} of a service (bind mounts are not named volumes)."""
    out = {}
    for v in svc.get("volumes") or []:
        if isinstance(v, str):
            source, _, rest = v.partition(":")
            target = rest.partition(":")[0]
        else:
            source, target = v.get("source", ""), v.get("target", "")
        if source in (doc.get("volumes") or {}):
            out[target] = source
    return out


def published_targets(svc: dict[str, Any]) -> list[tuple[str, int]]:
    """(host ip, container port) of each `ports` entry."""
    out = []
    for p in svc.get("ports") or []:
        if isinstance(p, dict):
            out.append((str(p.get("host_ip", "")), int(p["target"])))
        else:
            parts = str(p).split(":")
            out.append((parts[0] if len(parts) == 3 else "", int(parts[-1].split("/")[0])))
    return out


# ---- the topology, statically -----------------------------------------------------------
def topology_problems(doc: Doc) -> list[str]:
    """What keeps the file from being 3 control, 6 storage, 1 gateway and 1 one-shot init,
    each node with its own named volume, a health check and a restart policy, the secrets
    from the env file. An empty list when it is all there."""
    services: dict[str, dict[str, Any]] = doc.get("services") or {}
    roles = {name: role(svc) for name, svc in services.items()}
    counts = {r: sorted(n for n in roles if roles[n] == r) for r in set(roles.values())}
    problems = [f"expected {want} {r} services, found {counts.get(r, [])}"
                for r, want in (("control", 3), ("storage", 6), ("gateway", 1), ("init", 1))
                if len(counts.get(r, [])) != want]
    problems += [f"{n}: not an ecstore node, gateway or bootstrap" for n in counts.get("other", [])]
    owners: dict[str, str] = {}
    for name, svc in services.items():
        problems += secret_problems(name, svc)
        if roles[name] == "init":
            if svc.get("restart", "no") != "no":
                problems.append(f"{name}: a one-shot needs restart: \"no\"")
        else:
            problems += node_problems(doc, name, svc, owners)
    return problems + wiring_problems(services, roles)


def secret_problems(name: str, svc: dict[str, Any]) -> list[str]:
    inline = svc.get("environment") or {}
    problems = [f"{name}: {var} is set inline, not from the env file" for var in SECRET_VARS
                if any(str(e).partition("=")[0] == var for e in inline)]
    env: dict[str, str] = {}
    for f in env_file_paths(svc):
        env.update(read_env_file(COMPOSE_FILE.parent / f))
    if any(not env.get(v) for v in SECRET_VARS):
        problems.append(f"{name}: its env_file does not give all of {SECRET_VARS}")
    return problems


def node_problems(doc: Doc, name: str, svc: dict[str, Any], owners: dict[str, str]) -> list[str]:
    """A long-running service: restart policy, health check, its own volume, 0.0.0.0.
    `owners` collects {volume: service} across calls."""
    problems = []
    argv = argv_of(svc.get("command"))
    if svc.get("restart") not in ("unless-stopped", "always", "on-failure"):
        problems.append(f"{name}: no restart policy")
    test = argv_of((svc.get("healthcheck") or {}).get("test"))
    if test[:2] != ["CMD", "python"] or f"127.0.0.1:{flag(argv, '--port')}/" not in " ".join(test):
        problems.append(f"{name}: no python health check on its own --port")
    vols = named_volumes(doc, svc)
    if len(vols) != 1:
        problems.append(f"{name}: expected one named volume, found {vols}")
    for source in vols.values():
        if source in owners:
            problems.append(f"{name}: volume {source} is also {owners[source]}'s")
        owners[source] = name
    if role(svc) in ("control", "storage") and flag(argv, "--data") not in vols:
        problems.append(f"{name}: --data is not its volume's mount point")
    if flag(argv, "--host") != "0.0.0.0":
        problems.append(f"{name}: must listen on 0.0.0.0 inside its container")
    return problems


def wiring_problems(services: dict[str, dict[str, Any]], roles: dict[str, str]) -> list[str]:
    """init waits for every node and names each by its --id; the gateway waits for init
    and publishes the port it listens on."""
    problems = []
    inits = [n for n in services if roles[n] == "init"]
    nodes = {n for n in services if roles[n] in ("control", "storage")}
    for name in inits:
        init = services[name]
        waits = {d for d, c in depends_on(init).items() if c == "service_healthy"}
        if waits != nodes:
            problems.append(f"{name} must wait for every node to be healthy; waits for {sorted(waits)}")
        argv = argv_of(init.get("command"))
        for arg in (flag(argv, "--control") or "", flag(argv, "--storage") or ""):
            for item in filter(None, arg.split(",")):
                node_id, _, url = item.partition("=")
                host = URL_RE.match(url)
                svc = services.get(host[1] if host else "", {})
                if flag(argv_of(svc.get("command")), "--id") != node_id:
                    problems.append(f"{name}: {item} is not the --id of the service it names")
    for name in (n for n in services if roles[n] == "gateway"):
        gw = services[name]
        if not any(depends_on(gw).get(i) == "service_completed_successfully" for i in inits):
            problems.append(f"{name}: must depend on init completing successfully")
        port = int(flag(argv_of(gw.get("command")), "--port") or 0)
        if [t for _, t in published_targets(gw)] != [port]:
            problems.append(f"{name}: must publish its --port {port}, publishes "
                            f"{published_targets(gw)}")
    return problems


# ---- the local run ----------------------------------------------------------------------
def free_port() -> int:
    from cli.localcluster import free_port as fp
    return fp()


class ComposeRun:
    """The services of a compose dict as local processes. Planning (every rewrite) happens
    in __init__, so a reference to nothing fails before any process starts."""

    def __init__(self, doc: Doc, tmp: Path, start_gateway: bool = True) -> None:
        self.doc, self.tmp, self.start_gateway = unshared(doc), tmp, start_gateway
        self.services: dict[str, dict[str, Any]] = self.doc.get("services") or {}
        self.ports: dict[tuple[str, int], int] = {}
        for name, svc in self.services.items():
            port = flag(argv_of(svc.get("command")), "--port")
            if port is not None:
                self.ports[(name, int(port))] = free_port()
        self.mounts = {name: {target: tmp / "volumes" / source
                              for target, source in named_volumes(self.doc, svc).items()}
                       for name, svc in self.services.items()}
        self.argv = {n: self.rewrite_argv(n, argv_of(s.get("command")))
                     for n, s in self.services.items()}
        self.env = {n: {k: self.rewrite(n, v) for k, v in service_env(s).items()}
                    for n, s in self.services.items()}
        self.health = {n: self.health_argv(n, s) for n, s in self.services.items()}
        for name, svc in self.services.items():
            for _, target in published_targets(svc):
                if (name, target) not in self.ports:
                    raise ComposeError(f"{name} publishes port {target}, but listens on "
                                       f"{[p for s, p in self.ports if s == name]}")
        self.order = self.start_order()
        (tmp / "logs").mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.healthy: set[str] = set()
        self.completed: set[str] = set()
        self.skipped: list[str] = []

    # -- rewriting
    def url_port(self, name: str, host: str, port: int) -> int:
        target = name if host in LOOPBACK else host
        if (target, port) not in self.ports:
            raise ComposeError(f"{name} refers to http://{host}:{port}, but no service "
                               f"{target!r} listens on port {port}")
        return self.ports[(target, port)]

    def rewrite(self, name: str, arg: str) -> str:
        arg = URL_RE.sub(lambda m: f"http://127.0.0.1:{self.url_port(name, m[1], int(m[2]))}",
                         arg)
        for target, host_dir in self.mounts[name].items():
            if arg == target or arg.startswith(target + "/"):
                arg = str(host_dir) + arg[len(target):]
        return arg

    def rewrite_argv(self, name: str, argv: list[str]) -> list[str]:
        out: list[str] = []
        for i, arg in enumerate(argv):
            prev = argv[i - 1] if i else ""
            if prev == "--host":
                out.append("127.0.0.1")
            elif prev == "--port":
                out.append(str(self.ports[(name, int(arg))]))
            else:
                out.append(self.rewrite(name, arg))
        if out[:1] == ["python"]:
            out[:1] = [sys.executable]
        elif out[:1] == ["ecstore"]:  # the console script is cli.main:main (checked below)
            out[:1] = [sys.executable, "-m", "cli.main"]
        assert not any("0.0.0.0" in a for a in out), out  # loopback only, always
        return out

    def health_argv(self, name: str, svc: dict[str, Any]) -> list[str] | None:
        test = argv_of((svc.get("healthcheck") or {}).get("test"))
        if not test or test[0] == "NONE" or (svc.get("healthcheck") or {}).get("disable"):
            return None
        if test[0] == "CMD-SHELL":
            return ["sh", "-c", self.rewrite(name, " ".join(test[1:]))]
        return self.rewrite_argv(name, test[1:] if test[0] == "CMD" else test)

    def start_order(self) -> list[str]:
        order: list[str] = []
        pending = list(self.services)
        while pending:
            ready = [n for n in pending if set(depends_on(self.services[n])) <= set(order)]
            if not ready:
                raise ComposeError(f"depends_on has a cycle or an unknown service: {pending}")
            order += ready
            pending = [n for n in pending if n not in ready]
        return order

    # -- running
    def oneshot(self, name: str) -> bool:
        return self.services[name].get("restart", "no") == "no"

    def up(self) -> None:
        """Like `docker compose up --wait`: start in dependency order, honour conditions,
        then wait until every long-running service with a health check is healthy."""
        for name in self.order:
            for dep, condition in depends_on(self.services[name]).items():
                self.satisfy(name, dep, condition)
            if role(self.services[name]) == "gateway" and not self.start_gateway:
                self.skipped.append(name)
            elif self.oneshot(name):
                self.run_oneshot(name)
            else:
                self.start(name)
        for name in self.procs:
            if self.health[name] is not None:
                self.wait_healthy(name)

    def satisfy(self, name: str, dep: str, condition: str) -> None:
        if dep not in self.services:
            raise ComposeError(f"{name} depends on {dep}, which is not a service")
        if condition == "service_healthy":
            if self.health[dep] is None:
                raise ComposeError(f"{name} waits for {dep} to be healthy; it has no health check")
            self.wait_healthy(dep)
        elif condition == "service_completed_successfully" and dep not in self.completed:
            raise ComposeError(f"{name} needs {dep} to have completed successfully")

    def log(self, name: str) -> Path:
        return self.tmp / "logs" / f"{name}.log"

    def tail(self, name: str) -> str:
        try:
            return self.log(name).read_bytes()[-LOG_TAIL_BYTES:].decode("utf-8", "replace")
        except OSError:
            return ""

    def process_env(self, name: str) -> dict[str, str]:
        """The container's environment on top of ours, less any ECSTORE_* of ours."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("ECSTORE_")}
        return {**base, **self.env[name], "PYTHONPATH": str(ROOT)}

    def popen_args(self, name: str) -> dict[str, Any]:
        for d in self.mounts[name].values():
            d.mkdir(parents=True, exist_ok=True)
        return {"cwd": ROOT, "env": self.process_env(name), "stdin": subprocess.DEVNULL,
                "stderr": subprocess.STDOUT}

    def start(self, name: str) -> None:
        with open(self.log(name), "ab") as log:
            self.procs[name] = subprocess.Popen(self.argv[name], stdout=log,
                                                start_new_session=True, **self.popen_args(name))

    def run_oneshot(self, name: str) -> int:
        with open(self.log(name), "ab") as log:
            try:
                rc = subprocess.run(self.argv[name], stdout=log, timeout=ONESHOT_TIMEOUT_S,
                                    **self.popen_args(name)).returncode
            except subprocess.TimeoutExpired:
                raise ComposeError(f"{name} did not finish in {ONESHOT_TIMEOUT_S:g} s:\n"
                                   f"{self.tail(name)}") from None
        if rc != 0:
            raise ComposeError(f"{name} exited with {rc}:\n{self.tail(name)}")
        self.completed.add(name)
        return rc

    def wait_healthy(self, name: str) -> None:
        if name in self.healthy:
            return
        argv, deadline = self.health[name], time.monotonic() + HEALTH_TIMEOUT_S
        assert argv is not None
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is None:
                raise ComposeError(f"{name} is not running (not started)")
            if proc.poll() is not None:
                raise ComposeError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")
            try:
                check = subprocess.run(argv, capture_output=True, timeout=HEALTH_CHECK_TIMEOUT_S,
                                       env=self.process_env(name))
            except subprocess.TimeoutExpired:
                check = None
            if check is not None and check.returncode == 0:
                self.healthy.add(name)
                return
            time.sleep(0.2)
        raise ComposeError(f"{name} not healthy after {HEALTH_TIMEOUT_S:g} s:\n{self.tail(name)}")

    def down(self) -> None:
        """SIGTERM every process this run started, SIGKILL what is left after a while."""
        def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
            try:  # each was started in a session of its own: its group id is its pid
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            if proc.poll() is None:
                signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=STOP_TIMEOUT_S)

    # -- what a client needs
    def endpoint(self, name: str) -> str:
        """The URL a host client uses for the service's (first) published port."""
        _, target = published_targets(self.services[name])[0]
        return f"http://127.0.0.1:{self.ports[(name, target)]}"

    def urls(self, kind: str) -> list[str]:
        return [f"http://127.0.0.1:{port}" for (name, _), port in self.ports.items()
                if role(self.services[name]) == kind]


@contextmanager
def compose_up(doc: Doc, tmp: Path, start_gateway: bool = True) -> Iterator[ComposeRun]:
    run = ComposeRun(doc, tmp, start_gateway)
    try:
        run.up()
        yield run
    finally:
        run.down()

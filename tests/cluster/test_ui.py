"""The gateway's status page (/ui): who may open it, what status.json holds, that the page
needs nothing from the internet, and, in headless Chromium, that a stopped storage node is
shown down within the refresh interval (with a screenshot for a person to look at).

Chromium is Debian's `chromium` package, driven over the DevTools protocol with aiohttp's
websocket client (no browser automation library).
"""
# The fixtures are imported by name and shadowed by the test parameters that use them:
# ruff: noqa: F811
from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.client import BaseClient

from cli.localcluster import LocalCluster
from node import ui
from tests.cluster.s3_fixtures import (  # noqa: F401
    ROOT,
    Gateway,
    RawResponse,
    create_key,
    ecstore,
    gateway,
    http_request,
    make_client,
    poll,
    s3,
    s3_cluster,
    sign,
)

CHROMIUM = "/usr/bin/chromium"
INSTALL_HINT = "install it with: apt-get install -y chromium"
BROWSER_START_S = 30.0
PAGE_LOAD_S = 20.0
# the page asks every REFRESH_S; node probes are shared for SNAPSHOT_TTL_S; a killed node
# refuses connections at once. The slack covers a busy machine.
DOWN_WITHIN_S = ui.REFRESH_S + ui.SNAPSHOT_TTL_S + 3.0
SCREENSHOT = ROOT / "docs" / "ui-screenshot.png"   # refreshed with ECSTORE_UI_SCREENSHOT=1
VICTIM = "s3"


def get(gw: Gateway, path: str, headers: dict[str, str] | None = None) -> RawResponse:
    return http_request("GET", gw.url + path, headers=headers)


def basic(access_key: str, secret_key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{access_key}:{secret_key}".encode()).decode()}


def token_for(gw: Gateway, ttl_s: int = 600, secret_key: str | None = None) -> str:
    return ui.make_token(gw.access_key, secret_key or gw.secret_key, int(time.time()) + ttl_s)


@pytest.fixture(scope="module")
def objects(s3_cluster: LocalCluster, s3: BaseClient) -> dict[str, int]:
    """A few objects in two buckets (one small enough to be inline), and a repair run that
    records its progress in the _ops namespace: {bucket: objects}. Every test that asks the
    gateway for the page uses it, so that the page's first background count sees them."""
    s3.create_bucket(Bucket="datasets")
    s3.create_bucket(Bucket="checkpoints")
    for i in range(3):
        s3.put_object(Bucket="datasets", Key=f"shards/shard-{i:04d}.tar", Body=os.urandom(1 << 20))
    s3.put_object(Bucket="datasets", Key="README", Body=b"small objects live in their record")
    s3.put_object(Bucket="checkpoints", Key="step-100.pt", Body=os.urandom(5 << 20))
    ecstore(s3_cluster.path, "repair", "--json")
    return {"datasets": 4, "checkpoints": 1}


# ---- pure parts ----------------------------------------------------------------------------
def test_token_is_bound_to_key_secret_and_time() -> None:
    now = 1_800_000_000
    token = ui.make_token("ECADMIN0000000000001", "s" * 40, now + 60)
    claim = ui.token_claim(token)
    assert claim is not None and claim[:2] == ("ECADMIN0000000000001", now + 60)
    assert ui.token_ok(claim, "s" * 40, now)
    assert not ui.token_ok(claim, "t" * 40, now)                       # another secret
    assert not ui.token_ok(claim, "s" * 40, now + 61)                  # expired
    far = ui.token_claim(ui.make_token("ECADMIN0000000000001", "s" * 40, now + ui.MAX_TOKEN_TTL_S + 1))
    assert far is not None and not ui.token_ok(far, "s" * 40, now)     # too far ahead
    assert ui.token_claim(token.replace("v1.", "v2.")) is None
    assert ui.token_claim(token + "0") is None


def test_basic_credentials_parse_only_basic() -> None:
    assert ui.basic_credentials(basic("AK", "se:cret")["Authorization"]) == ("AK", "se:cret")
    assert ui.basic_credentials("Basic !!!") == ("", "")
    assert ui.basic_credentials("AWS4-HMAC-SHA256 Credential=AK/...") is None
    assert ui.basic_credentials("") is None


def test_op_summary_shows_progress_and_fields() -> None:
    assert ui.op_summary(None) == {"recorded": False}
    s = ui.op_summary({"ts": 1_800_000_000 * 10**9, "version_id": "v", "deleted": False,
                       "state": "running", "done": 30, "remaining": 90, "rate_mb_s": 12.5,
                       "report": {"rebuilt": 3, "unrecoverable": 0},
                       "errors": ["a", "b", "c", "d"], "objects": [1, 2]})
    assert s["recorded"] and s["progress"] == 0.25 and s["updated"] == 1_800_000_000
    assert s["fields"]["state"] == "running" and s["fields"]["report.rebuilt"] == 3
    assert s["fields"]["errors"] == ["b", "c", "d"] and s["fields"]["objects"] == "2 items"
    assert "ts" not in s["fields"] and "version_id" not in s["fields"]
    assert ui.op_summary({"ts": 1, "deleted": False, "done": 5, "total": 5})["progress"] == 1.0


def test_error_log_keeps_the_last_warnings_newest_first() -> None:
    errors = ui.ErrorLog()
    log = logging.getLogger("ecstore.test-ui")
    log.addHandler(errors)
    try:
        log.info("not an error")
        for i in range(ui.MAX_ERRORS + 5):
            log.warning("GET /b/k%d: too few nodes answered", i)
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("unhandled error in GET /b/x")
    finally:
        log.removeHandler(errors)
    recent = errors.recent()
    assert len(recent) == ui.MAX_ERRORS
    assert recent[0]["level"] == "error" and "ValueError: boom" in recent[0]["message"]
    assert recent[1]["message"] == f"GET /b/k{ui.MAX_ERRORS + 4}: too few nodes answered"


def test_error_log_makes_one_entry_per_request() -> None:
    """Why a request failed (dispatch's warning) and its status (the access log's line) are
    one entry, joined by the request id."""
    errors = ui.ErrorLog()
    why, access = logging.getLogger("ecstore.test-ui"), logging.getLogger(ui.ACCESS_LOGGER)
    for logger in (why, access):
        logger.addHandler(errors)
    try:
        why.warning("GET /b/k: too few nodes answered", extra={"fields": {"request_id": "R1"}})
        access.warning("request", extra={"fields": {"request_id": "R2", "method": "PUT",
                                                    "op": "s3.put_object", "status": 500}})
        access.warning("request", extra={"fields": {"request_id": "R1", "method": "GET",
                                                    "op": "s3.get_object", "status": 503}})
    finally:
        for logger in (why, access):
            logger.removeHandler(errors)
    [r2, r1] = errors.recent()
    assert (r1["request_id"], r1["op"], r1["status"]) == ("R1", "s3.get_object", 503)
    assert r1["message"] == "GET /b/k: too few nodes answered"
    assert (r2["request_id"], r2["status"], r2["message"]) == ("R2", 500, "PUT answered 500")


# ---- over HTTP -----------------------------------------------------------------------------
def test_status_page_needs_an_admin_key(s3_cluster: LocalCluster, gateway: Gateway,
                                        objects: dict[str, int]) -> None:
    for path in (ui.UI_PATH, ui.STATUS_PATH):
        r = get(gateway, path)
        assert r.status == 401, (path, r)
        assert r.headers["www-authenticate"].startswith("Basic realm=")
    assert get(gateway, ui.UI_PATH, basic(gateway.access_key, "wrong" * 8)).status == 401
    assert get(gateway, ui.UI_PATH, basic("ECNOSUCHKEY000000000", gateway.secret_key)).status == 401
    assert get(gateway, f"{ui.UI_PATH}?token={token_for(gateway, secret_key='x' * 40)}").status == 401
    assert get(gateway, f"{ui.UI_PATH}?token={token_for(gateway, ttl_s=-1)}").status == 401

    r = get(gateway, ui.UI_PATH, basic(gateway.access_key, gateway.secret_key))
    assert r.status == 200 and r.headers["content-type"].startswith("text/html")
    cookie = r.headers["set-cookie"]
    assert f"{ui.COOKIE}=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    value = cookie.split(";")[0]
    assert get(gateway, ui.STATUS_PATH, {"Cookie": value}).status == 200   # the page's fetches
    assert get(gateway, f"{ui.STATUS_PATH}?token={token_for(gateway)}").status == 200

    # S3 signatures: SigV4 in the header, and a presigned URL a browser can open
    url = gateway.url + ui.STATUS_PATH
    assert http_request("GET", url, headers=sign(gateway, "GET", url)).status == 200
    presigned = make_client(gateway, signature_version="s3v4").generate_presigned_url(
        "list_objects", Params={"Bucket": "ui"}, ExpiresIn=300)
    r = http_request("GET", presigned)
    assert r.status == 200 and b"<table id=\"nodes\">" in r.body and f"{ui.COOKIE}=" in r.headers["set-cookie"]

    alice = create_key(s3_cluster, "alice")
    r = get(gateway, ui.UI_PATH, basic(alice["access_key"], alice["secret_key"]))
    assert r.status == 403, r


def test_page_loads_nothing_from_elsewhere(gateway: Gateway, objects: dict[str, int]) -> None:
    r = get(gateway, ui.UI_PATH, basic(gateway.access_key, gateway.secret_key))
    html = r.body.decode()
    assert not re.search(r"(https?:)?//[\w.-]+\.\w", html), "the page names another host"
    assert not re.search(r"""\b(src|href)\s*=""", html), "the page loads a file"
    assert "@import" not in html and "url(" not in html
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "http" not in csp


def test_status_json_has_nodes_ring_usage_ops_errors(s3_cluster: LocalCluster, gateway: Gateway,
                                                      objects: dict[str, int]) -> None:
    auth = basic(gateway.access_key, gateway.secret_key)
    s = json.loads(get(gateway, ui.STATUS_PATH, auth).body)
    assert s["gateway"] == "gw1" and s["refresh_s"] == ui.REFRESH_S and s["epoch"] >= 1
    nodes = {(n["role"], n["id"]): n for n in s["nodes"]}
    expected = {(n.role, n.id) for n in s3_cluster.nodes.values()}
    assert set(nodes) == expected
    for n in nodes.values():
        assert {"id", "role", "zone", "tier", "up", "ring_share"} <= n.keys()
        assert n["up"] is True
    storage = [n for n in nodes.values() if n["role"] == "storage"]
    for n in storage:
        assert 0 < n["disk_free_bytes"] <= n["disk_total_bytes"] and n["fragments"] >= 0
    for n in nodes.values():   # control nodes report their disk too, and a state
        if n["role"] != "gateway":
            assert 0 < n["disk_free_bytes"] <= n["disk_total_bytes"], n
        assert n["state"] == "up" and n["problems"] == [], n
    for role in ("storage", "control"):
        shares = [n["ring_share"] for n in nodes.values() if n["role"] == role]
        assert abs(sum(shares) - 1.0) < 0.01 and min(shares) > 0
    assert set(s["ops"]) == set(ui.OPS) and all("recorded" in op for op in s["ops"].values())
    repair = s["ops"]["repair"]    # written by `ecstore repair` (the objects fixture)
    assert repair["recorded"] and repair["progress"] == 1.0 and repair["fields"]["remaining"] == 0
    assert time.time() - 120 < repair["updated"] <= time.time()
    assert isinstance(s["errors"], list)

    # bucket usage is counted in the background: the objects appear within one interval
    def usage() -> dict[str, Any]:
        return dict(json.loads(get(gateway, ui.STATUS_PATH, auth).body)["usage"])
    u = poll(usage, lambda u: {b["bucket"] for b in u["buckets"]} >= set(objects),
             ui.USAGE_INTERVAL_S + 15, "bucket usage to count the test objects")
    per_bucket: dict[str, int] = {}
    for b in u["buckets"]:
        per_bucket[b["bucket"]] = per_bucket.get(b["bucket"], 0) + b["objects"]
        assert b["stored_bytes"] >= b["bytes"]
    assert per_bucket == objects
    inline = [b for b in u["buckets"] if b["policy"] == "inline"]
    assert inline == [{"bucket": "datasets", "policy": "inline", "tier": "control", "objects": 1,
                       "bytes": 34, "stored_bytes": 34 * 3}]   # a copy per control replica
    hot = next(t for t in u["tiers"] if t["tier"] == "hot")
    assert hot["objects"] == 4 and hot["stored_bytes"] == hot["bytes"] * 6 // 4


def test_status_json_names_the_op_and_status_of_a_failed_request(
        s3_cluster: LocalCluster, gateway: Gateway, objects: dict[str, int]) -> None:
    """A request the gateway fails (no metadata quorum: 2 of 3 control nodes stopped) is one
    entry of the last errors with its operation and status, not only dispatch's warning:
    the request log line is written past the logging handlers in a node process, so the
    error log never saw it and showed op and status as null."""
    url = f"{gateway.url}/datasets/README"
    try:
        for node_id in ("c2", "c3"):
            s3_cluster.stop_node(node_id)
        r = http_request("GET", url, headers=sign(gateway, "GET", url))
        assert r.status == 503, r
    finally:
        for node_id in ("c2", "c3"):
            s3_cluster.start_node(node_id)
        s3_cluster.wait_healthy(["c2", "c3"])
    rid = r.headers["x-amz-request-id"]
    auth = basic(gateway.access_key, gateway.secret_key)

    def entry() -> dict[str, Any] | None:
        errors = json.loads(get(gateway, ui.STATUS_PATH, auth).body)["errors"]
        return next((e for e in errors if e["request_id"] == rid), None)
    # the access log line is written once the response is sent: allow it a moment
    e = poll(entry, lambda e: e is not None and e["status"] is not None, 10.0,
             "the failed GET's entry with its status")
    assert e is not None
    assert (e["op"], e["status"], e["level"]) == ("get_object", 503, "warning"), e
    assert "/datasets/README" in e["message"], e


# ---- in the browser ------------------------------------------------------------------------
class Browser:
    """Headless Chromium and one page, driven over the DevTools protocol (a websocket)."""

    def __init__(self, profile: Path, log: Path) -> None:
        if not os.access(CHROMIUM, os.X_OK):
            pytest.fail(f"{CHROMIUM} not found: the status page test needs Debian's chromium; "
                        f"{INSTALL_HINT}")
        self.loop = asyncio.new_event_loop()
        self.ids = iter(range(1, 1 << 30))
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-extensions", "--mute-audio", "--hide-scrollbars",
                 f"--user-data-dir={profile}", "--remote-debugging-port=0",
                 "--window-size=1360,1000", "about:blank"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            port_file = profile / "DevToolsActivePort"
            poll(lambda: port_file.exists() and len(port_file.read_text().split()) >= 2, bool,
                 BROWSER_START_S, f"chromium to start (see {log}; {INSTALL_HINT})")
            port = port_file.read_text().split()[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.load(r)
            page = next(t for t in targets if t["type"] == "page")
            self.ws = self.loop.run_until_complete(self._connect(page["webSocketDebuggerUrl"]))
        except BaseException:
            self.close()
            raise

    async def _connect(self, url: str) -> aiohttp.ClientWebSocketResponse:
        self.session = aiohttp.ClientSession()
        return await self.session.ws_connect(url, max_msg_size=64 << 20)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.loop.run_until_complete(asyncio.wait_for(self._call(method, params), 30))

    async def _call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        msg_id = next(self.ids)
        await self.ws.send_json({"id": msg_id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json()
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    def eval(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: Path) -> None:
        """The whole page, however long, as a PNG."""
        height = self.eval("document.documentElement.scrollHeight")
        self.call("Emulation.setDeviceMetricsOverride", width=1360, height=int(height),
                  deviceScaleFactor=1, mobile=False)
        png = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(png["data"]))

    def close(self) -> None:
        if hasattr(self, "session"):
            self.loop.run_until_complete(self.session.close())
        self.loop.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)   # chromium and the helpers it started
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path / "chromium-profile", tmp_path / "chromium.log")
    yield b
    b.close()


NODE_STATES = """Object.fromEntries([...document.querySelectorAll('#nodes tbody tr[data-node]')]
                  .map((tr) => [tr.dataset.role + '/' + tr.dataset.node, tr.dataset.state]))"""


def test_browser_shows_a_stopped_storage_node_down(s3_cluster: LocalCluster, gateway: Gateway,
                                                    objects: dict[str, int], browser: Browser,
                                                    tmp_path: Path) -> None:
    browser.call("Page.enable")
    browser.call("Page.navigate", url=f"{gateway.url}{ui.UI_PATH}?token={token_for(gateway)}")
    everyone_up = {f"{n.role}/{n.id}": "up" for n in s3_cluster.nodes.values()}
    poll(lambda: browser.eval(NODE_STATES), lambda s: s == everyone_up, PAGE_LOAD_S,
         "the node table with every node up")
    assert browser.eval("location.search") == "", "the token stays in the address bar"
    poll(lambda: browser.eval("document.querySelector('#buckets tbody').textContent"),
         lambda text: "checkpoints" in text and "datasets" in text, ui.USAGE_INTERVAL_S + 15,
         "the buckets table")
    try:
        # a request the gateway fails (no metadata quorum with 2 of 3 control nodes stopped)
        # is listed among the last errors
        for node_id in ("c2", "c3"):
            s3_cluster.stop_node(node_id)
        url = f"{gateway.url}/datasets/README"
        assert http_request("GET", url, headers=sign(gateway, "GET", url)).status == 503
        for node_id in ("c2", "c3"):
            s3_cluster.start_node(node_id)
        s3_cluster.wait_healthy(["c2", "c3"])
        poll(lambda: browser.eval("document.querySelector('#errors tbody').textContent"),
             lambda text: "/datasets/README" in text, PAGE_LOAD_S, "the failed GET in the errors table")
        poll(lambda: browser.eval(NODE_STATES), lambda s: s == everyone_up, PAGE_LOAD_S,
             "every node up again")

        s3_cluster.kill_node(VICTIM)
        stopped = time.monotonic()
        states = poll(lambda: browser.eval(NODE_STATES),
                      lambda s: s.get(f"storage/{VICTIM}") == "down", DOWN_WITHIN_S,
                      f"{VICTIM} to be shown down within {DOWN_WITHIN_S:.0f} s")
        took_s = time.monotonic() - stopped
        assert [k for k, v in states.items() if v == "down"] == [f"storage/{VICTIM}"], states
        summary = browser.eval("document.getElementById('summary').textContent")
        assert summary == f"{len(everyone_up) - 1} of {len(everyone_up)} nodes up"
        assert browser.eval("document.getElementById('summary').className") == "pill bad"
        print(f"\n{VICTIM} shown down {took_s:.1f} s after SIGKILL")
        browser.screenshot(tmp_path / "ui.png")
    finally:
        stopped_ids = [i for i in s3_cluster.nodes if i not in s3_cluster.running()]
        for node_id in stopped_ids:
            s3_cluster.start_node(node_id)
        s3_cluster.wait_healthy(stopped_ids)
    png = (tmp_path / "ui.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    if os.environ.get("ECSTORE_UI_SCREENSHOT") == "1":  # a run does not dirty the checkout
        shutil.copyfile(tmp_path / "ui.png", SCREENSHOT)
    print(f"screenshot: {tmp_path / 'ui.png'}")

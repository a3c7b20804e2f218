"""`python -m node.ui`, the status page's sign-in URL: bad input is a message and exit 2,
never a traceback (a missing cluster.json ended in store.errors.BadRequest's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def ui(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ECSTORE_CLUSTER", "ECSTORE_CONTROL")}
    return subprocess.run([sys.executable, "-m", "node.ui", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=60, env={**env, "PYTHONPATH": str(ROOT)})


def test_bad_input_is_a_message_and_exit_2(tmp_path: Path) -> None:
    for args in (["--cluster", str(tmp_path / "none.json")], [], ["--ttl-s", "-5"]):
        proc = ui(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "error" in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert proc.stdout == ""


def test_a_cluster_file_with_a_gateway_gives_a_url(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({
        "secret": "s" * 32, "control": ["http://127.0.0.1:1"],
        "gateway": {"url": "http://127.0.0.1:2", "access_key": "ECADMIN0000000000001",
                    "secret_key": "k" * 40}}))
    proc = ui("--cluster", str(cluster), "--ttl-s", "60", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("http://127.0.0.1:2/ui?token=v1.ECADMIN0000000000001.")
    cluster.write_text(json.dumps({"secret": "s" * 32, "control": ["http://127.0.0.1:1"]}))
    proc = ui("--cluster", str(cluster), cwd=tmp_path)
    assert proc.returncode == 1 and "names no gateway" in proc.stderr, proc.stderr

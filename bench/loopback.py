"""What one request/answer round trip between two processes on this machine costs in CPU,
over TCP on 127.0.0.1 and over a Unix socket: a 300-byte request, an answer of each size
asked for, one at a time, both processes' user + system CPU counted (getrusage).

    python -m bench.loopback [--sizes 200,262144,1048576] [--count 5000] [--rounds 2] [--json]

The nodes talk to each other with such round trips (a fragment GET: a small request, a
fragment back), so this is the floor under every request between two ecstore processes.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
import time
from typing import Any

REQUEST = b"x" * 300
KINDS = ("tcp", "unix")


def _serve(listener: socket.socket, answer: bytes, tcp: bool) -> None:
    conn, _ = listener.accept()
    if tcp:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(len(REQUEST))
    while True:
        got = 0
        while got < len(REQUEST):
            n = conn.recv_into(memoryview(buf)[got:])
            if n == 0:
                os._exit(0)
            got += n
        conn.sendall(answer)


def _cpu_s(who: int) -> tuple[float, float]:
    ru = resource.getrusage(who)
    return ru.ru_utime + ru.ru_stime, ru.ru_stime


def round_trips(kind: str, size: int, count: int) -> dict[str, Any]:
    """`count` round trips with a forked server; per round trip: wall us, CPU us of both
    processes, and the system part of it."""
    tcp = kind == "tcp"
    with tempfile.TemporaryDirectory() as tmp:
        if tcp:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
        else:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(os.path.join(tmp, "s"))
        listener.listen(1)
        where = listener.getsockname()
        answer = os.urandom(size)
        child_before = _cpu_s(resource.RUSAGE_CHILDREN)
        pid = os.fork()
        if pid == 0:   # pragma: no cover - the server, in the child
            try:
                _serve(listener, answer, tcp)
            finally:
                os._exit(0)
        listener.close()
        client = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(where)
        if tcp:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = memoryview(bytearray(size))
        me_before = _cpu_s(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        for _ in range(count):
            client.sendall(REQUEST)
            got = 0
            while got < size:
                n = client.recv_into(buf[got:])
                if n == 0:
                    raise RuntimeError("the server closed the connection")
                got += n
        wall = time.perf_counter() - t0
        me_after = _cpu_s(resource.RUSAGE_SELF)
        client.close()
        os.waitpid(pid, 0)
        child_after = _cpu_s(resource.RUSAGE_CHILDREN)
    cpu = (me_after[0] - me_before[0]) + (child_after[0] - child_before[0])
    sys_s = (me_after[1] - me_before[1]) + (child_after[1] - child_before[1])
    return {"kind": kind, "answer_bytes": size, "count": count,
            "wall_us": wall / count * 1e6, "cpu_us": cpu / count * 1e6,
            "sys_us": sys_s / count * 1e6}


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of byte counts: {text!r}") from None
    if not sizes or any(s < 1 or s > 64 << 20 for s in sizes):
        raise argparse.ArgumentTypeError("sizes must be 1 byte to 64 MiB")
    return sizes


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(prog="python -m bench.loopback", description=doc.split("\n\n")[0])
    ap.add_argument("--sizes", type=parse_sizes, default=[200, 262144, 1048576],
                    help="answer sizes in bytes, comma-separated")
    ap.add_argument("--count", type=int, default=5000, help="round trips per measure")
    ap.add_argument("--rounds", type=int, default=2, help="measures of each, alternated")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    if a.count < 1 or a.rounds < 1:
        ap.error("--count and --rounds must be at least 1")
    rows = [round_trips(kind, size, a.count)
            for _ in range(a.rounds) for size in a.sizes for kind in KINDS]
    if a.json:
        print(json.dumps({"kernel": os.uname().release, "round_trips": rows}, indent=2))
        return 0
    print(f"one round trip, 300 B request (kernel {os.uname().release}), both processes' CPU")
    print(f"{'socket':6} {'answer B':>9} {'wall us':>8} {'CPU us':>8} {'of it sys':>10}")
    for r in rows:
        print(f"{r['kind']:6} {r['answer_bytes']:9d} {r['wall_us']:8.1f} {r['cpu_us']:8.1f} "
              f"{r['sys_us']:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

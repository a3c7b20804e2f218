"""node.server.Allocator: large buffers come from malloc's heaps (reused warm), and what a
burst leaves free goes back to the system once trimmed. Run in a child process: mallopt
changes the whole process."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json
    from node.server import Allocator
    import node.server as server
    a = Allocator()
    assert a.libc is not None, "not glibc"
    base = a.rss_bytes()
    held = [bytearray(1 << 20) for _ in range(256)]     # a burst: 256 MiB of 1 MiB buffers
    for b in held:
        b[::4096] = b"x" * len(b[::4096])                # touch every page
    keep = held[::64]                                    # a few stay live, spread out
    peak = a.rss_bytes()
    del held, b
    server.TRIM_ABOVE_BYTES = 1 << 62
    skipped = a.trim()                                   # under the floor: nothing done
    server.TRIM_ABOVE_BYTES = 0
    trimmed = a.trim()
    print(json.dumps({"base": base, "peak": peak, "after": a.rss_bytes(), "skipped": skipped,
                      "trimmed": trimmed, "kept": len(keep)}))
""")


def test_burst_is_given_back_after_trim() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=60, check=True)
    r = json.loads(out.stdout)
    mib = 1 << 20
    assert r["peak"] - r["base"] >= 200 * mib, r           # the burst was really resident
    assert r["skipped"] is False and r["trimmed"] is True
    # four 1 MiB buffers stay live; the other 252 MiB went back to the system
    assert r["after"] - r["base"] < 64 * mib, r


BURSTS = textwrap.dedent("""
    import json, resource, sys
    from store import tune_allocator
    tuned = tune_allocator() if sys.argv[1] == "tuned" else None
    def bursts(n):
        for _ in range(n):
            held = [bytearray(1 << 20) for _ in range(8)]   # 8 MiB at once, then freed
            del held
    bursts(2)                                               # warm: the heap has grown
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    bursts(50)
    print(json.dumps({"tuned": tuned,
                      "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
""")


def test_tune_allocator_reuses_buffers_instead_of_faulting_them_in_again() -> None:
    """store.tune_allocator (opt-in for library users): with glibc's defaults each burst
    of 1 MiB buffers is handed back to the system and faulted in again (~2,000 page
    faults per 8 MiB); tuned, the heap keeps it."""
    runs = {}
    for mode in ("default", "tuned"):
        out = subprocess.run([sys.executable, "-c", BURSTS, mode], capture_output=True,
                             text=True, timeout=60, check=True)
        runs[mode] = json.loads(out.stdout)
    assert runs["tuned"]["tuned"] is True
    assert runs["default"]["faults"] > 50 * 1000, runs      # the defaults fault it all in
    assert runs["tuned"]["faults"] < runs["default"]["faults"] / 10, runs


UNFILLED_CHILD = textwrap.dedent("""
    import json
    from store.alloc import UNFILLED_MIN_BYTES, tune_allocator, unfilled
    assert tune_allocator()
    n = 4 << 20
    old = bytearray(b"\\xab") * n          # freed below: the next buffer of its size reuses it
    del old
    buf = unfilled(n)
    mid = bytes(buf[n // 2:n // 2 + 4096])
    buf[:4] = b"abcd"
    small = unfilled(UNFILLED_MIN_BYTES - 1)
    print(json.dumps({"type": type(buf).__name__, "len": len(buf), "head": buf[:4].decode(),
                      "stale": mid == b"\\xab" * 4096, "small_zeroed": small == bytes(len(small)),
                      "empty": len(unfilled(0))}))
""")


def test_unfilled_skips_the_zero_fill_of_large_buffers_only() -> None:
    out = subprocess.run([sys.executable, "-c", UNFILLED_CHILD], capture_output=True, text=True,
                         timeout=60, check=True)
    got = json.loads(out.stdout)
    assert got["type"] == "bytearray" and got["len"] == 4 << 20 and got["head"] == "abcd"
    assert got["stale"]            # what the freed buffer held: no memset ran
    assert got["small_zeroed"] and got["empty"] == 0


TICKS_CHILD = textwrap.dedent("""
    import json
    import node.server as server
    from node.server import Allocator
    a = Allocator()
    assert a.libc is not None, "not glibc"
    server.TRIM_ABOVE_BYTES = 0                 # every tick is over the floor here
    now, cpu, out = 1000.0, 50.0, []
    a._last_tick, a._last_trim = (now, cpu), now

    def tick(dt, used):
        global now, cpu
        now, cpu = now + dt, cpu + used
        return a.tick(now, cpu)
    out.append(["quiet", tick(1.0, 0.01)])
    for i in range(int(server.TRIM_BUSY_EVERY_S) - 1):   # a burst: a core busy, each second
        out.append(["busy", tick(1.0, 0.9)])
    out.append(["busy, the busy period", tick(1.0, 0.9)])
    out.append(["busy again", tick(1.0, 0.9)])
    out.append(["over: quiet", tick(1.0, 0.1)])
    server.TRIM_ABOVE_BYTES = 1 << 62
    out.append(["quiet under the floor", tick(1.0, 0.0)])
    print(json.dumps({"ticks": out, "trims": a.trims}))
""")


def test_trims_once_a_burst_is_over_not_in_the_middle_of_it() -> None:
    """A node gives memory back when a tick finds it quiet (under a quarter of a core
    since the last), or after TRIM_BUSY_EVERY_S busy - not every second of a burst, whose
    next buffers would fault the pages in again."""
    out = subprocess.run([sys.executable, "-c", TICKS_CHILD], capture_output=True, text=True,
                         timeout=60, check=True)
    got = json.loads(out.stdout)
    ticks = got["ticks"]
    assert ticks[0] == ["quiet", True]
    busy = [t for name, t in ticks if name == "busy"]
    assert len(busy) == 29 and not any(busy)
    assert dict(ticks[-4:]) == {"busy, the busy period": True, "busy again": False,
                                "over: quiet": True, "quiet under the floor": False}
    assert got["trims"] == 3

"""Reading a node's /metrics page in tests, with prometheus_client's own parser (what a
Prometheus server would read), however the page was fetched."""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

# (sample name, sorted labels) -> value
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    """The samples named `name`, by the value of their label `label`."""
    return {dict(ls)[label]: v for (n, ls), v in samples.items()
            if n == name and label in dict(ls)}


def counters(text: str, names: Iterable[str], prefix: str = "") -> dict[str, float]:
    """The unlabelled samples prefix+name of a page, by name; AssertionError naming any the
    page does not have (a counter that is gone must not read as 0)."""
    samples = parse(text)
    out = {n: samples.get((prefix + n, ())) for n in names}
    missing = [prefix + n for n, v in out.items() if v is None]
    assert not missing, f"not on the /metrics page: {', '.join(missing)}"
    return {n: float(v) for n, v in out.items() if v is not None}

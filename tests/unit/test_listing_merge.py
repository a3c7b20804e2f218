"""The pure listing merge against a naive model, with replicas, tombstones and pages."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from store.listing import merge_page, newest_per_key
from tests.cluster.test_listing import model

keys_st = st.lists(st.text(alphabet="ab/c", min_size=1, max_size=6), min_size=0, max_size=40,
                   unique=True)


@settings(max_examples=200, deadline=None)
@given(keys=keys_st, deleted=st.sets(st.integers(0, 39)), prefix=st.sampled_from(["", "a", "a/", "b"]),
       delimiter=st.sampled_from(["", "/"]), max_keys=st.integers(1, 50),
       replicas=st.integers(1, 3))
def test_merge_matches_model(keys: list[str], deleted: set[int], prefix: str, delimiter: str,
                             max_keys: int, replicas: int) -> None:
    live = [k for i, k in enumerate(keys) if i not in deleted]
    # node r holds every key; older live versions on some nodes, the newest wins
    streams = []
    for r in range(replicas):
        rows = []
        for i, k in enumerate(sorted(keys)):
            if not k.startswith(prefix):
                continue
            gone = keys.index(k) in deleted
            newest_here = (i + r) % replicas == 0 or r == 0
            ts = 10 if newest_here else 5
            rows.append([k, ts, "v", gone if newest_here else not gone, 1, None, "", None])
        streams.append(iter(rows))
    page = merge_page(newest_per_key(streams), prefix, delimiter, max_keys)
    objs, prefixes, truncated = model(live, prefix, delimiter, "", max_keys)
    assert [o.key for o in page.objects] == objs
    assert page.common_prefixes == prefixes
    assert page.truncated == truncated

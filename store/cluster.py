"""Finding and reading cluster.json: --cluster PATH, else $ECSTORE_CLUSTER, else ./.ecstore."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.errors import BadRequest

DEFAULT_CLUSTER_PATH = Path(".ecstore") / "cluster.json"


def cluster_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit:
        return Path(explicit)
    env = os.environ.get("ECSTORE_CLUSTER")
    return Path(env) if env else DEFAULT_CLUSTER_PATH


def no_cluster_file(explicit: str | os.PathLike[str] | None = None) -> bool:
    """Neither --cluster nor $ECSTORE_CLUSTER given and no ./.ecstore/cluster.json: the
    cluster is the one $ECSTORE_CONTROL names, if any (as inside the containers)."""
    return not explicit and "ECSTORE_CLUSTER" not in os.environ \
        and not cluster_path(explicit).exists()


def state_path(explicit: str | os.PathLike[str] | None, name: str) -> Path:
    """Where a resumable command (repair, rebalance) keeps its position: beside the cluster
    file, or under ~/.ecstore when there is none (the containers' working directory is not
    writable)."""
    if no_cluster_file(explicit):
        return Path.home() / ".ecstore" / name
    return cluster_path(explicit).parent / name


def read_cluster_file(p: Path, missing: str) -> Any:
    """The JSON of a cluster file: BadRequest(`missing`) when there is none, one naming
    the file when it is not JSON (or not UTF-8)."""
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise BadRequest(missing) from None
    except IsADirectoryError:
        raise BadRequest(f"cluster file {p} is a directory: give the cluster.json in it "
                         f"({p / 'cluster.json'})") from None
    except OSError as exc:
        raise BadRequest(f"cannot read cluster file {p}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"cluster file {p} is not valid JSON: {exc}") from None


@dataclass(frozen=True)
class ClusterInfo:
    """What a client needs to reach a cluster."""

    control: tuple[str, ...]
    secret: str
    nodes: tuple[dict[str, Any], ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def load(path: str | os.PathLike[str] | None = None) -> "ClusterInfo":
        """From --cluster PATH, else $ECSTORE_CLUSTER, else ./.ecstore/cluster.json; when
        none is given and that file does not exist, from $ECSTORE_CONTROL (comma separated
        control URLs) and $ECSTORE_SECRET, as set inside the docker-compose containers
        ($ECSTORE_GATEWAY: the S3 gateway's URL, which `status` checks too)."""
        p = cluster_path(path)
        env_control = os.environ.get("ECSTORE_CONTROL", "")
        if env_control and no_cluster_file(path):
            urls = tuple(u.strip() for u in env_control.split(",") if u.strip())
            gateway = os.environ.get("ECSTORE_GATEWAY", "").strip()   # for `status` to show it
            return ClusterInfo(urls, os.environ.get("ECSTORE_SECRET", ""),
                               raw={"gateway": {"url": gateway}} if gateway else {})
        data = read_cluster_file(p, f"no cluster file at {p}: start one with `ecstore "
                                    "cluster up`, or pass --cluster PATH / set ECSTORE_CLUSTER")
        try:
            control, secret = data["control"], data["secret"]
            nodes = tuple(data.get("nodes", ()))
        except (KeyError, TypeError, AttributeError):
            raise BadRequest(f"cluster file {p} lacks 'control' or 'secret'") from None
        if (not isinstance(control, list) or not all(isinstance(u, str) for u in control)
                or not isinstance(secret, str)):
            raise BadRequest(f"cluster file {p}: 'control' must be a list of URLs and "
                             "'secret' a string")
        return ClusterInfo(tuple(control), secret, nodes, data)

"""TF_CONFIG and cluster specs, as pure functions (no TensorFlow import).

TensorFlow reads the cluster from the process-global TF_CONFIG variable; raytf builds it from
the addresses its actors bound themselves, so nobody hand-writes ports.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from raytf.errors import ConfigError

TASK_TYPES = ("chief", "worker", "ps", "evaluator")


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"Bad task address {address!r}: expected 'host:port' with a port in 1..65535, "
            "for example '10.0.0.5:41234'."
        )


def cluster_spec(
    workers: Sequence[str],
    ps: Sequence[str] = (),
    chief: str | None = None,
) -> dict[str, list[str]]:
    """Cluster spec dict in TensorFlow's layout: ``{"worker": [...], "ps": [...]}``.

    Jobs with no tasks are left out, as TensorFlow expects.
    """
    spec: dict[str, list[str]] = {}
    if chief is not None:
        spec["chief"] = [chief]
    if workers:
        spec["worker"] = list(workers)
    if ps:
        spec["ps"] = list(ps)
    if not spec:
        raise ConfigError("A cluster spec needs at least one task; received no addresses.")
    everything = [a for tasks in spec.values() for a in tasks]
    for address in everything:
        _check_address(address)
    duplicates = sorted({a for a in everything if everything.count(a) > 1})
    if duplicates:
        raise ConfigError(f"Two tasks share an address {duplicates}; each task needs its own port.")
    return spec


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int) -> dict:
    """The TF_CONFIG dict for one task of ``cluster``."""
    if task_type not in cluster:
        raise ConfigError(
            f"Task type {task_type!r} is not in the cluster (it has {sorted(cluster)})."
        )
    if not 0 <= task_index < len(cluster[task_type]):
        raise ConfigError(
            f"Task index {task_index} is out of range for {task_type!r}, which has "
            f"{len(cluster[task_type])} task(s)."
        )
    return {
        "cluster": {k: list(v) for k, v in cluster.items()},
        "task": {"type": task_type, "index": task_index},
    }


def tf_config_json(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int) -> str:
    return json.dumps(tf_config(cluster, task_type, task_index), sort_keys=True)


def is_chief(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int) -> bool:
    """TensorFlow's rule: the chief task if there is one, else worker 0."""
    if "chief" in cluster:
        return task_type == "chief"
    return task_type == "worker" and task_index == 0

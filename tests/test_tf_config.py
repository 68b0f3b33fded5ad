"""TF_CONFIG built by raytf, against known-good TensorFlow layouts."""

from __future__ import annotations

import json

import pytest

from raytf._internal.tf_config import cluster_spec, is_chief, tf_config, tf_config_json
from raytf.errors import ConfigError


def test_worker_cluster_matches_tensorflow_docs():
    # The layout in TensorFlow's multi-worker tutorial.
    cluster = cluster_spec(workers=["localhost:12345", "localhost:23456"])
    assert tf_config(cluster, "worker", 1) == {
        "cluster": {"worker": ["localhost:12345", "localhost:23456"]},
        "task": {"type": "worker", "index": 1},
    }


def test_parameter_server_cluster():
    cluster = cluster_spec(workers=["h1:1", "h2:2"], ps=["h3:3"], chief="h0:9")
    assert cluster == {"chief": ["h0:9"], "worker": ["h1:1", "h2:2"], "ps": ["h3:3"]}
    assert json.loads(tf_config_json(cluster, "ps", 0))["task"] == {"type": "ps", "index": 0}
    assert is_chief(cluster, "chief", 0) and not is_chief(cluster, "worker", 0)


def test_worker_zero_is_chief_without_a_chief_task():
    cluster = cluster_spec(workers=["h1:1", "h2:2"])
    assert is_chief(cluster, "worker", 0) and not is_chief(cluster, "worker", 1)


@pytest.mark.parametrize("address", ["nohost", "h:0", "h:70000", ":80", "h:x"])
def test_bad_address(address):
    with pytest.raises(ConfigError, match="expected 'host:port'"):
        cluster_spec(workers=[address])


def test_duplicate_addresses_are_refused():
    with pytest.raises(ConfigError, match="share an address"):
        cluster_spec(workers=["h:1", "h:1"])


def test_task_out_of_range():
    cluster = cluster_spec(workers=["h:1"])
    with pytest.raises(ConfigError, match="out of range"):
        tf_config(cluster, "worker", 1)
    with pytest.raises(ConfigError, match="not in the cluster"):
        tf_config(cluster, "ps", 0)

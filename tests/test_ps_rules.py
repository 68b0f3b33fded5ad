"""Parameter-server settings, sharding and staleness summaries: pure, no Ray or TensorFlow."""

from __future__ import annotations

from collections import Counter

import pytest

import raytf
from raytf._internal.backends.ray_ps.backend import summarize
from raytf._internal.sharding import shard_by_size
from raytf.errors import ConfigError


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"staleness": -1}, r"staleness must be 0 .*received -1"),
        ({"staleness": 1.5}, r"staleness must be .*received 1.5"),
        ({"staleness": "sometimes"}, r"received 'sometimes'"),
        ({"backup_workers": 2}, r"backup_workers=2 with workers=2 .*at most 1"),
        ({"backup_workers": -1}, r"backup_workers must be an integer >= 0, received -1"),
        ({"backup_workers": 1, "staleness": 2}, r"backup_workers=1 needs staleness=0"),
        ({"ps": 0}, r"ps=0 .*needs ps=1 or more.*all-reduce"),
        ({"ps": -2}, r"ps must be a positive integer, received -2"),
        ({"workers": 0}, r"workers must be a positive integer, received 0"),
        ({"backend": "horovod"}, r"unknown backend 'horovod'; choose one of \['auto', 'ray'"),
        ({"backend": "tensorflow"}, r"asynchronous only.*staleness=None.*backend='ray'"),
        ({"backend": "tensorflow", "staleness": None, "backup_workers": 1}, "backup_workers"),
        ({"cpus_per_ps": 0}, r"cpus_per_ps must be a positive number, received 0"),
    ],
)
def test_bad_settings_say_what_and_how_to_fix(options, message):
    with pytest.raises(ConfigError, match=message):
        raytf.ParameterServer(**options)


def test_modes_and_resources():
    assert raytf.ParameterServer().mode == "sync"
    assert raytf.ParameterServer(staleness=3).mode == "bounded staleness 3"
    assert raytf.ParameterServer(staleness="async").staleness is None
    lay = raytf.ParameterServer(workers=3, ps=2, cpus_per_ps=2, use_gpu=True)
    assert lay.bundles() == [{"CPU": 1.0, "GPU": 1.0}] * 3 + [{"CPU": 2.0}] * 2
    tf_engine = raytf.ParameterServer(workers=2, ps=1, staleness=None, backend="tensorflow")
    assert [r for r, _ in tf_engine.roles()] == ["worker", "worker", "ps", "chief"]
    assert len(tf_engine.bundles()) == 4
    specs = tf_engine.strategy_specs([f"10.0.0.1:{p}" for p in (5001, 5002, 5003, 5004)])
    assert specs[0].cluster == {
        "chief": ["10.0.0.1:5004"],
        "worker": ["10.0.0.1:5001", "10.0.0.1:5002"],
        "ps": ["10.0.0.1:5003"],
    }
    assert [s.is_chief for s in specs] == [False, False, False, True]


@pytest.mark.parametrize(
    ("sizes", "servers", "expected"),
    [
        ([100], 1, [0]),
        ([10, 10, 10, 10], 2, [0, 1, 0, 1]),
        ([1000, 1, 1, 1, 998], 2, [0, 1, 1, 0, 1]),  # 1001 vs 1000 bytes
        ([5, 40, 5, 30, 20], 3, [2, 0, 2, 1, 2]),  # 40, 30, 30
    ],
)
def test_sharding_places_each_variable_once_and_balances_bytes(sizes, servers, expected):
    owner = shard_by_size(sizes, servers)
    assert owner == expected
    loads = [sum(s for s, o in zip(sizes, owner) if o == k) for k in range(servers)]
    # Largest-first greedy: no server exceeds the ideal share by more than the largest item.
    assert max(loads) <= sum(sizes) / servers + max(sizes)
    assert set(owner) == set(range(servers))


def test_more_servers_than_variables_is_refused():
    with pytest.raises(ConfigError, match=r"ps=3 server\(s\) but the model has 2 variable"):
        shard_by_size([4, 4], 3)


def test_staleness_summary_percentiles():
    summary = summarize(Counter({0: 50, 1: 40, 2: 9, 7: 1}))
    assert summary["count"] == 100 and summary["max"] == 7
    assert (summary["p50"], summary["p90"], summary["p99"]) == (0, 1, 2)
    assert summary["histogram"] == {0: 50, 1: 40, 2: 9, 7: 1}
    assert summarize(Counter()) is None


def test_epoch_logs_weigh_each_worker_by_the_steps_it_trained():
    from raytf._internal.runtime.schedule import mean_logs as _mean_logs

    # A replacement that joined as the epoch ended trained 0 steps: its empty loss (0)
    # must not halve the epoch's loss; validation covers the same data on each worker.
    logs = [{"loss": 1.5, "val_loss": 1.0}, {"loss": 0.0, "val_loss": 3.0}]
    assert _mean_logs(logs, [32, 0]) == {"loss": 1.5, "val_loss": 2.0}
    assert _mean_logs(logs, [16, 16]) == {"loss": 0.75, "val_loss": 2.0}
    assert _mean_logs(logs) == {"loss": 0.75, "val_loss": 2.0}  # layouts without counts

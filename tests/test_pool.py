"""Warm actors between runs (raytf/_internal/runtime/pool.py), on a real 2-CPU Ray."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import workloads
from conftest import alive_actors

import raytf
from raytf._internal.runtime.pool import POOL

pytestmark = pytest.mark.ray

LAYOUT = raytf.AllReduce(workers=2)


@pytest.fixture(scope="module")
def two_cpus():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    POOL.idle_s = None
    ray.shutdown()


def run():
    return raytf.fit(
        workloads.mlp, workloads.data, layout=LAYOUT, global_batch_size=64, epochs=2, verbose=False
    )


def gcs_actors(ids=None):
    import ray

    table = ray._private.state.actors()
    return {i: a for i, a in table.items() if ids is None or i in ids}


def wait_for(condition, what: str, timeout_s: float = 60.0):
    """Poll ``condition`` (Ray's own state) until it holds, with a deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        time.sleep(0.1)


def test_the_next_run_takes_fresh_warm_actors_and_trains_the_same(two_cpus):
    first = run()
    warm = POOL.actor_ids()
    assert len(warm) == 2 and alive_actors() == []  # only warm ones are left
    second = run()
    # The second run's workers were the warm actors: processes that never served a run.
    table = gcs_actors(warm)
    assert sorted(int(a["Pid"]) for a in table.values()) == sorted(w.pid for w in second.workers)
    assert not {w.pid for w in first.workers} & {w.pid for w in second.workers}
    # Nothing of the first run's TensorFlow state reached the second: the same weights.
    for a, b in zip(first.weights, second.weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert POOL.actor_ids().isdisjoint(warm)  # and fresh ones wait for the next


def test_a_warm_actor_that_died_is_replaced(two_cpus):
    if not POOL.actor_ids():
        run()
    warm = POOL.actor_ids()
    victim = next(iter(warm))
    wait_for(lambda: gcs_actors({victim})[victim]["State"] == "ALIVE", "the warm actor started")
    os.kill(int(gcs_actors({victim})[victim]["Pid"]), signal.SIGKILL)
    wait_for(lambda: gcs_actors({victim})[victim]["State"] == "DEAD", "the kill was seen")
    result = run()
    assert result.epochs_trained == 2 and not result.failures
    survivor = next(iter(warm - {victim}))
    assert int(gcs_actors({survivor})[survivor]["Pid"]) in {w.pid for w in result.workers}


def test_another_layout_releases_the_warm_group(two_cpus):
    """The warm all-reduce group holds both CPUs; towers needs them: it must not wait."""
    if not POOL.actor_ids():
        run()
    result = raytf.fit(
        workloads.mlp,
        workloads.data,
        layout=raytf.InGraph(devices=2, strategy="towers"),
        global_batch_size=64,
        verbose=False,
        timeouts=raytf.Timeouts(placement_s=20),
    )
    assert result.epochs_trained == 1


def test_idle_warm_actors_go_away(two_cpus):
    from ray.util import placement_group_table

    raytf.keep_warm(0.5)
    try:
        run()
        warm = POOL.actor_ids()
        assert len(warm) == 2
        wait_for(lambda: len(POOL) == 0, "the warm group expired")
        wait_for(
            lambda: all(a["State"] == "DEAD" for a in gcs_actors(warm).values()),
            "the warm actors stopped",
        )
        wait_for(
            lambda: all(g["state"] == "REMOVED" for g in placement_group_table().values()),
            "the group was released",
        )
        raytf.keep_warm(0)
        run()
        assert len(POOL) == 0 and alive_actors() == []  # off: nothing is kept
    finally:
        POOL.idle_s = None
    with pytest.raises(raytf.ConfigError, match="keep_warm takes seconds >= 0"):
        raytf.keep_warm(-1)


class SeeSpares(raytf.Callback):
    """Which spares wait when a failure is seen (the recovery should take them)."""

    def __init__(self):
        self.spares: set[str] = set()

    def on_failure(self, record):
        self.spares = POOL.spare_ids()


def test_a_recovery_takes_the_spares(two_cpus, tmp_path):
    """A worker SIGKILLed mid-run: the restarted group is the spares that had imported
    TensorFlow while the run trained, not new processes."""
    seen = SeeSpares()
    result = raytf.fit(
        workloads.mlp,
        workloads.dying_data(str(tmp_path / "killed"), at_step=10),
        layout=LAYOUT,
        global_batch_size=64,
        epochs=2,
        failures=raytf.FailurePolicy(max_failures=1),
        callbacks=[seen],
        verbose=False,
    )
    assert len(result.failures) == 1 and result.epochs_trained == 2
    assert len(seen.spares) == 2
    spare_pids = {int(a["Pid"]) for a in gcs_actors(seen.spares).values()}
    assert spare_pids == {w.pid for w in result.workers}
    assert POOL.spare_ids() == set()  # the run is over: its spares went with it

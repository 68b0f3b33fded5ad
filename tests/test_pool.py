"""Warm actors between runs, and spares for recoveries (raytf/_internal/runtime/pool.py), on
a real 2-CPU Ray."""

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
    raytf.keep_warm(60)  # the default, which conftest turns off for the rest of the suite
    yield ray
    POOL.idle_s = None
    POOL.clear()
    ray.shutdown()


def run(data=workloads.data, **kwargs):
    return raytf.fit(
        workloads.mlp,
        data,
        layout=LAYOUT,
        global_batch_size=64,
        epochs=2,
        verbose=False,
        **kwargs,
    )


def gcs_actors(ids):
    import ray

    return {i: a for i, a in ray._private.state.actors().items() if i in ids}


def pids(ids) -> set[int]:
    return {int(a["Pid"]) for a in gcs_actors(ids).values()}


def wait_for(condition, what: str, timeout_s: float = 60.0):
    """Poll ``condition`` (Ray's own state) until it holds, with a deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        time.sleep(0.1)


def test_warm_actors_serve_the_next_run_are_replaced_when_dead_and_expire(two_cpus):
    from ray.util import placement_group_table

    first = run()
    warm = POOL.actor_ids()
    assert len(warm) == 2 and alive_actors() == []  # only the warm ones are left
    second = run()
    # The second run's workers were the warm actors: processes that never served a run.
    assert pids(warm) == {w.pid for w in second.workers}
    assert not {w.pid for w in first.workers} & {w.pid for w in second.workers}
    # Nothing of the first run's TensorFlow state reached the second: the same weights.
    for a, b in zip(first.weights, second.weights, strict=True):
        np.testing.assert_array_equal(a, b)

    # A warm actor that died while idle is replaced; the other one serves.
    warm = POOL.actor_ids()
    victim, survivor = sorted(warm)
    wait_for(lambda: gcs_actors({victim})[victim]["State"] == "ALIVE", "the warm actor started")
    os.kill(int(gcs_actors({victim})[victim]["Pid"]), signal.SIGKILL)
    wait_for(lambda: gcs_actors({victim})[victim]["State"] == "DEAD", "the kill was seen")
    raytf.keep_warm(0.5)
    try:
        third = run()
        assert third.epochs_trained == 2 and not third.failures
        assert pids({survivor}) <= {w.pid for w in third.workers}
        # Idle for 0.5 s, the group and its actors go away.
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
        assert alive_actors() == []
    finally:
        raytf.keep_warm(60)
    with pytest.raises(raytf.ConfigError, match="keep_warm takes seconds >= 0"):
        raytf.keep_warm(-1)


def test_warm_groups_give_way_to_other_layouts_and_other_work(two_cpus):
    """A warm group holds both CPUs for 10 minutes. Another layout gets them at once; then a
    plain Ray actor asks for them and gets them: the watcher saw the pending demand."""
    import ray

    raytf.keep_warm(600)
    try:
        run()
        assert len(POOL) == 1
        towers = raytf.fit(
            workloads.mlp,
            workloads.data,
            layout=raytf.InGraph(devices=2, strategy="towers"),
            global_batch_size=64,
            verbose=False,
            timeouts=raytf.Timeouts(placement_s=20),
        )
        assert towers.epochs_trained == 1 and len(POOL) == 1  # towers' own group, now
        hog = ray.remote(num_cpus=2)(type("Hog", (), {"ping": lambda self: 1})).remote()
        assert ray.get(hog.ping.remote(), timeout=120) == 1
        assert len(POOL) == 0
        ray.kill(hog)
    finally:
        raytf.keep_warm(60)


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
    result = run(
        data=workloads.dying_data(str(tmp_path / "killed"), at_step=10),
        failures=raytf.FailurePolicy(max_failures=1),
        callbacks=[seen],
    )
    assert len(result.failures) == 1 and result.epochs_trained == 2
    assert len(seen.spares) == 2
    assert pids(seen.spares) == {w.pid for w in result.workers}
    assert POOL.spare_ids() == set()  # the run is over: its spares are the warm ones now
    assert len(POOL) == 1
    raytf.keep_warm(0)  # off: what is kept goes at once
    try:
        assert len(POOL) == 0 and alive_actors() == []
    finally:
        raytf.keep_warm(60)

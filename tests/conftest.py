"""Shared fixtures: a guard against leaked environment variables (TF_CONFIG!) and Ray."""

from __future__ import annotations

import os

import pytest
import workloads
from ray import cloudpickle

# Ray workers cannot import the tests directory: ship the workload functions by value.
cloudpickle.register_pickle_by_value(workloads)

# The tests declare GPUs to Ray that do not exist (tensorflow-cpu): let actors train on CPU
# stand-ins for them. Without it, an actor given GPUs that TensorFlow cannot see fails fast
# (test_gpu_contracts.py checks that). Set before any Ray starts, so every node inherits it.
os.environ["RAYTF_CPU_STANDIN"] = "1"
# Warm actors off for the suite: every run would start its successors' processes on this
# 2-core machine while the next test mostly wants another layout. test_pool.py turns them on
# (raytf.keep_warm, which wins over this) and tests them there.
os.environ["RAYTF_KEEP_WARM_S"] = "0"

WATCHED = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "RAY_ADDRESS")


@pytest.fixture(autouse=True)
def no_env_leaks():
    """raytf sets TF_CONFIG only inside actors; the test process must never see one."""
    before = {k: os.environ.get(k) for k in WATCHED}
    yield
    after = {k: os.environ.get(k) for k in WATCHED}
    assert after == before, f"environment leaked: {before} -> {after}"


@pytest.fixture(scope="module")
def local_ray():
    """One real local Ray per test module (4 CPUs declared on a 2-core machine)."""
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_with_gpus():
    """A real local Ray with 2 fake GPUs declared (TensorFlow here is CPU-only: stand-ins)."""
    import ray

    ray.init(
        address="local", num_cpus=4, num_gpus=2, include_dashboard=False, logging_level="WARNING"
    )
    yield ray
    ray.shutdown()


#: Ray Data's own actors, which live as long as the datasets a test made (not raytf's).
RAY_DATA_ACTORS = {
    "_AutoscalingCoordinatorActor",
    "_StatsActor",
    "SplitCoordinator",
    "ActorLocationTracker",
}


def alive_actors() -> list[str]:
    """Names of live actor classes, from the GCS (the state API needs the dashboard), but
    the fresh actors a run that ended well left warm for the next (raytf's warm pool)."""
    import ray

    from raytf._internal.runtime.pool import POOL

    warm = POOL.actor_ids()
    return [
        a.get("ActorClassName", "?")
        for actor_id, a in ray._private.state.actors().items()
        if a["State"] == "ALIVE"
        and a.get("ActorClassName", "?") not in RAY_DATA_ACTORS
        and actor_id not in warm
    ]

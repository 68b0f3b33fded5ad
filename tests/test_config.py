"""Validation of arguments and layout objects, and the layout registry. No Ray, no TF."""

from __future__ import annotations

import pytest

import raytf
from raytf._internal.cluster import ClusterInfo
from raytf._internal.job import Job, check_batch_split
from raytf.errors import ConfigError, PlacementError, WorkerError


def model_fn():
    return None


def data_fn(ctx):
    return None


def test_registered_layout_names_are_pinned():
    assert raytf.layout_names() == [
        "all-reduce",
        "in-graph",
        "mirrored",
        "parameter-server",
        "towers",
    ]


def test_public_api_is_small_and_explicit():
    assert set(raytf.__all__) == {
        "AllReduce",
        "Callback",
        "ConfigError",
        "FailurePolicy",
        "FailureRecord",
        "FitResult",
        "InGraph",
        "InputContext",
        "Layout",
        "ParameterServer",
        "PlacementError",
        "Plan",
        "Preempted",
        "ProgressLogger",
        "RaytfError",
        "ResizeRecord",
        "RunInfo",
        "ServerRow",
        "StartupTimeoutError",
        "SweepResult",
        "Timeouts",
        "WorkerError",
        "WorkerRow",
        "evaluate",
        "fit",
        "layout_names",
        "plan",
        "predict",
        "sweep",
        "trial_resources",
        "keep_warm",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model_fn": object()}, "model must be a function that builds a keras.Model"),
        ({"data_fn": [1, 2]}, r"data must be a function \(InputContext\)"),
        ({"global_batch_size": 0}, "global_batch_size must be a positive integer, received 0"),
        ({"epochs": -1}, "epochs must be a positive integer, received -1"),
        ({"steps_per_epoch": 0}, "steps_per_epoch must be a positive integer"),
        ({"steps_per_execution": "fast"}, "steps_per_execution must be a positive integer"),
        ({"resume": True}, "resume=True needs checkpoint_dir="),
        ({"seed": "x"}, "seed must be an int or None"),
    ],
)
def test_job_rejects_bad_values(kwargs, message):
    args = {"model_fn": model_fn, "data_fn": data_fn, "global_batch_size": 8, **kwargs}
    with pytest.raises(ConfigError, match=message):
        Job(**args)


def test_batch_that_cannot_split_says_what_to_use():
    expected = r"250 cannot be split evenly over 4 replicas.*248 or 252"
    with pytest.raises(ConfigError, match=expected):
        check_batch_split(250, 4)
    check_batch_split(256, 4)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: raytf.AllReduce(workers=0), "workers must be a positive integer, received 0"),
        (lambda: raytf.InGraph(devices=0), "devices must be a positive integer, received 0"),
        (lambda: raytf.InGraph(strategy="fast"), "unknown strategy 'fast'"),
        (lambda: raytf.InGraph(engine="mirrored"), "engine='mirrored' was renamed: pass strategy="),
        (lambda: raytf.ParameterServer(engine="ray"), "renamed: pass backend='ray'"),
        (lambda: raytf.InGraph(cpus_per_worker=0), "cpus_per_worker must be a positive number"),
        (lambda: raytf.AllReduce(communication="nccl"), "needs GPUs"),
        (lambda: raytf.AllReduce(devices=2), "one CPU device per worker"),
        (lambda: raytf.Timeouts(peers_s=0), "peers_s must be a positive number"),
        (lambda: raytf.InGraph(devices=0.5, use_gpu=True), "fraction of a GPU.*whole GPUs"),
        (lambda: raytf.AllReduce(devices=0.25, use_gpu=True), "cannot share one"),
    ],
)
def test_layout_objects_validate(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_unknown_layout_lists_the_choices():
    with pytest.raises(ConfigError, match=r"Unknown layout 'ring'.*'all-reduce', 'in-graph'"):
        raytf.plan("ring", cluster=ClusterInfo.from_counts((4, 0)))


def test_plan_without_ray():
    plan = raytf.plan(cluster=ClusterInfo.from_counts((8, 2), (8, 2)))
    assert plan.layout == raytf.AllReduce(workers=2, devices=2, use_gpu=True)
    assert plan.bundles == [{"CPU": 1.0, "GPU": 2.0}] * 2
    assert "all-reduce" in str(plan)


def test_named_layout_that_can_never_fit():
    with pytest.raises(PlacementError, match="can never hold"):
        raytf.plan(raytf.InGraph(devices=4, use_gpu=True), cluster=ClusterInfo.from_counts((8, 2)))


def test_replicas_disagreeing_with_layout_object():
    with pytest.raises(ConfigError, match="replicas=4 disagrees"):
        raytf.plan(raytf.InGraph(devices=2), replicas=4, cluster=ClusterInfo.from_counts((8, 0)))


def test_errors_survive_pickling():
    import pickle

    err = WorkerError("boom", worker="worker-1", error_type="KeyError", remote_traceback="tb")
    back = pickle.loads(pickle.dumps(err))
    assert (back.worker, back.error_type, back.remote_traceback) == ("worker-1", "KeyError", "tb")
    assert "Traceback in the worker" in str(back)
    cfg = pickle.loads(pickle.dumps(ConfigError("bad")))
    assert isinstance(cfg, ValueError) and str(cfg) == "bad"


def test_epoch_timeout_adapts_to_the_epochs_seen():
    adaptive = raytf.Timeouts()
    assert adaptive.epoch_limit([]) == 24 * 3600
    assert adaptive.epoch_limit([30.0]) == 600  # at least ten minutes
    assert adaptive.epoch_limit([200.0, 400.0]) == 2000  # five times the longest
    assert raytf.Timeouts(epoch_s=90).epoch_limit([1000.0]) == 90


@pytest.mark.parametrize(
    ("mode", "batch", "sizes", "batches"),
    [
        # Global: the batch stays; 3 workers cannot split 32 exactly, so it is skipped.
        ("global", 32, [4, 2, 1], [32, 32, 32]),
        # Per worker: each keeps 8 examples; the global batch follows the worker count.
        ("per_worker", 32, [4, 3, 2, 1], [32, 24, 16, 8]),
    ],
)
def test_elastic_sizes_and_batches(mode, batch, sizes, batches):
    from raytf._internal.runtime.elastic import Sizing

    policy = raytf.FailurePolicy(max_failures=1, min_workers=1, elastic_batch=mode)
    sizing = Sizing(policy, full=4, devices=1, global_batch_size=batch)
    assert sizing.sizes() == sizes
    assert [sizing.batch_for(n) for n in sizes] == batches


@pytest.mark.parametrize(
    ("given", "raytf_env", "ray_env", "expected"),
    [
        (None, None, None, None),  # a private local Ray
        ("auto", "10.0.0.1:6379", "10.0.0.2:6379", "auto"),  # the argument wins
        (None, "10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.1:6379"),  # then RAYTF_ADDRESS
        (None, None, "10.0.0.2:6379", "10.0.0.2:6379"),  # then RAY_ADDRESS (set in Ray jobs)
    ],
)
def test_one_address_rule_for_the_api_and_the_cli(monkeypatch, given, raytf_env, ray_env, expected):
    from raytf.api import cluster_address

    for name, value in (("RAYTF_ADDRESS", raytf_env), ("RAY_ADDRESS", ray_env)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert cluster_address(given) == expected


def test_a_job_submission_address_is_refused_with_the_fix(monkeypatch):
    from raytf.api import cluster_address

    monkeypatch.setenv("RAY_ADDRESS", "http://head:8265")
    with pytest.raises(ConfigError, match=r"RAY_ADDRESS is 'http://head:8265'.*ray job submit"):
        cluster_address(None)

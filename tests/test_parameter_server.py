"""Parameter-server layouts on real Ray: every mode trains, bounds hold, state survives resume."""

from __future__ import annotations

import os

import numpy as np
import pytest
import workloads
from conftest import alive_actors

import raytf

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BATCH = 64
STEPS = workloads.EXAMPLES // BATCH  # per worker and epoch
VARIABLES = {
    "sequential/dense/kernel",
    "sequential/dense/bias",
    "sequential/dense_1/kernel",
    "sequential/dense_1/bias",
}


def fit(layout, data=workloads.data, **kwargs):
    options = dict(global_batch_size=BATCH, epochs=2, layout=layout, verbose=False)
    return raytf.fit(workloads.mlp, data, **{**options, **kwargs})


def test_bounded_staleness_never_exceeds_its_bound(local_ray):
    # Worker 1 is slowed, so worker 0 keeps reaching the bound and must wait there.
    layout = raytf.ParameterServer(workers=2, ps=2, staleness=1)
    result = fit(layout, workloads.straggler_data(0.02))
    loss = result.history["loss"]
    assert loss[-1] < loss[0]
    assert result.steps_ahead["max"] <= 1, result.steps_ahead
    # An epoch is STEPS x 2 worker batches, each gradient applied once, on every server;
    # a gradient still in flight when the epoch closed is dropped, never applied.
    for server in result.servers:
        assert server.applied == 2 * 2 * STEPS
        assert server.pushes == server.applied + server.dropped
    assert result.global_step == 2 * 2 * STEPS
    assert sum(result.staleness["histogram"].values()) == 2 * 2 * 2 * STEPS
    # Sharding: each variable on exactly one of the two servers, each server holding some.
    holds = [set(s.holds) for s in result.servers]
    assert holds[0] and holds[1] and not holds[0] & holds[1]
    assert holds[0] | holds[1] == VARIABLES
    assert all(s.bytes > 0 for s in result.servers)
    rates = [w.steps_per_second for w in result.workers]
    assert all(r and r > 0 for r in rates)
    assert alive_actors() == []


def test_asynchronous_training_applies_every_gradient(local_ray):
    # Through Ray's object store (the other tests use the default TCP streams): both
    # transports carry the same protocol.
    layout = raytf.ParameterServer(workers=2, ps=1, staleness="async", transport="object-store")
    result = fit(layout, validation_data=workloads.validation)
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert "val_accuracy" in result.history
    (server,) = result.servers
    assert server.transport == "object-store"
    assert server.applied == result.global_step == 2 * 2 * STEPS
    assert server.pushes == server.applied + server.dropped
    assert sum(result.staleness["histogram"].values()) == 2 * 2 * STEPS


def test_backup_worker_closes_steps_without_the_straggler(local_ray):
    layout = raytf.ParameterServer(workers=2, ps=1, backup_workers=1)
    result = fit(layout, workloads.straggler_data(0.02))
    assert result.history["loss"][-1] < result.history["loss"][0]
    (server,) = result.servers
    # The default transport, and the server's Adam update fused by XLA.
    assert server.transport == "tcp" and server.xla is True
    # The epoch ends after STEPS synchronous steps, whoever computed them.
    assert server.applied == result.global_step == 2 * STEPS
    # Each closed step averaged 1 or 2 gradients; a late gradient is dropped, never applied.
    accepted = server.pushes - server.dropped
    assert server.applied <= accepted <= 2 * server.applied


def test_server_checkpoint_resume_matches_the_uninterrupted_run(local_ray, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    layout = raytf.ParameterServer(workers=2, ps=2)
    # Synchronous over two servers is one big batch: Keras's own fit in one process is the
    # uninterrupted run.
    task = local_ray.remote(max_calls=1)(workloads.keras_reference)
    _, reference = local_ray.get(task.remote(3, BATCH))
    first = fit(layout, epochs=2, checkpoint_dir=ckpt)
    assert sorted(os.listdir(ckpt)) == ["model.keras", "ps-0", "ps-1"]
    assert first.checkpoint and first.checkpoint.endswith(f"ckpt-{2 * STEPS}")  # by version
    resumed = fit(layout, epochs=3, checkpoint_dir=ckpt, resume=True)
    assert resumed.epochs_trained == 1 and resumed.global_step == 3 * STEPS
    # Weights and Adam's moments came back from the servers: the same weights as no break.
    for got, want in zip(resumed.weights, reference, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_worker_error_reaches_the_caller_and_everything_stops(local_ray):
    with pytest.raises(raytf.WorkerError, match=r"worker-1 .*shard-1\.tfrecord: no such file"):
        fit(raytf.ParameterServer(workers=2, ps=1), workloads.data_fails_on_worker_1)
    assert alive_actors() == []


def test_tensorflow_engine_trains_with_its_own_strategy(local_ray, tmp_path):
    layout = raytf.ParameterServer(
        workers=2, ps=2, staleness=None, backend="tensorflow", cpus_per_ps=0.5
    )
    result = fit(
        layout, validation_data=workloads.validation, checkpoint_dir=str(tmp_path), epochs=3
    )
    loss = result.history["loss"]
    assert loss[-1] < loss[0]
    # Metrics updated by two workers at once stay exact (Keras's assign_add is not atomic).
    assert all(0 <= a <= 1 for a in result.history["accuracy"])
    # Asynchronous: one optimizer step per worker batch, counted on the servers.
    assert result.global_step == 3 * 2 * STEPS
    # TensorFlow's own placement: every model variable on exactly one ps task.
    holds = [set(s.holds) & VARIABLES for s in result.servers]
    assert len(holds) == 2 and not holds[0] & holds[1] and holds[0] | holds[1] == VARIABLES
    assert result.checkpoint and os.path.exists(result.checkpoint + ".index")
    # The worker tasks with the devices they drive, then the chief that measured the run.
    assert [(w.name, w.role) for w in result.workers] == [
        ("worker-0", "worker"), ("worker-1", "worker"), ("chief", "chief"),
    ]  # fmt: skip
    assert [w.devices for w in result.workers[:2]] == [("/device:CPU:0",)] * 2
    assert result.workers[2].fingerprint and len(result.worker_throughput) == 1
    assert alive_actors() == []

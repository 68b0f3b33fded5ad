"""Fault tolerance with real processes killed: SIGKILL a worker mid-epoch, SIGTERM one, and
corrupt the newest checkpoint; every run must finish the steps it was asked for."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import workloads
from conftest import alive_actors

import raytf

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BATCH, EPOCHS = 32, 3
STEPS = workloads.EXAMPLES // BATCH  # 16 per epoch
EVERY = 4  # steps between checkpoints
# Kills land mid-epoch, several batches from any boundary: the data pipeline (where the
# kill fires) runs a few batches ahead of training.

LAYOUTS = {
    "in-graph": (raytf.InGraph(devices=2, strategy="towers"), 0),
    "all-reduce": (raytf.AllReduce(workers=2), 1),
}


def fit(layout, data=workloads.data, **kwargs):
    options = dict(global_batch_size=BATCH, epochs=EPOCHS, layout=layout, verbose=False)
    return raytf.fit(workloads.mlp, data, **{**options, **kwargs})


@pytest.fixture(scope="module")
def undisturbed(local_ray):
    """Keras's own fit on the same batches: every layout here matches it undisturbed
    (tests/test_layouts.py), so a recovered run must too."""
    task = local_ray.remote(max_calls=1)(workloads.keras_reference)
    return local_ray.get(task.remote(EPOCHS, BATCH))[1]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sigkill_mid_epoch_recovers_and_finishes_every_step(local_ray, undisturbed, tmp_path, name):
    layout, victim = LAYOUTS[name]
    marker = str(tmp_path / "killed")
    at_step = STEPS + 9  # epoch 2, between its checkpoints
    policy = raytf.FailurePolicy(max_failures=2, checkpoint_every_steps=EVERY)
    result = fit(layout, workloads.dying_data(marker, at_step, worker=victim), failures=policy)
    assert os.path.exists(marker)  # the process really was killed
    (failure,) = result.failures
    assert failure.reason == "died" and failure.epoch == 1
    assert failure.worker == ("worker" if victim == 0 and name == "in-graph" else "worker-1")
    # Every requested step was trained, and no more than one checkpoint interval twice.
    assert result.global_step == EPOCHS * STEPS
    # (0 when the kill landed between segments: the data pipeline runs ahead of training.)
    assert 0 <= result.steps_redone <= EVERY
    assert result.steps_trained == EPOCHS * STEPS + result.steps_redone
    assert failure.recovery_s > 0 and result.time_lost_s >= failure.recovery_s
    # Restored weights, optimizer state and data position: the same model as no failure.
    for got, want in zip(result.weights, undisturbed, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert len(result.history["loss"]) == EPOCHS
    assert alive_actors() == []


def test_more_failures_than_the_policy_allows_fail_the_run(local_ray, tmp_path):
    layout, victim = LAYOUTS["all-reduce"]
    data = workloads.dying_data(str(tmp_path / "killed"), 4, worker=victim)
    with pytest.raises(raytf.WorkerError, match=r"worker-1 died"):
        fit(layout, data, failures=raytf.FailurePolicy(max_failures=0))
    assert alive_actors() == []


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_sigterm_checkpoints_before_the_worker_goes(local_ray, undisturbed, tmp_path, name):
    layout, victim = LAYOUTS[name]
    marker = str(tmp_path / "terminated")
    ckpt = tmp_path / "ckpt"
    at_step = STEPS + 8
    result = fit(
        layout,
        workloads.dying_data(marker, at_step, worker=victim, sig=int(signal.SIGTERM)),
        failures=raytf.FailurePolicy(max_failures=1),
        checkpoint_dir=str(ckpt),
        steps_per_execution=1,
    )
    (failure,) = result.failures
    assert failure.reason == "preempted" and "SIGTERM" in failure.error
    assert failure.worker == ("worker" if name == "in-graph" else "worker-1")
    # The workers wrote a checkpoint where they stopped (under all-reduce they agreed on the
    # step first), and training went on from exactly it.
    restored = failure.restored_checkpoint
    assert restored and os.path.exists(restored + ".index")
    assert failure.restored_epoch == 1 and 0 < failure.restored_step < STEPS
    assert result.steps_redone == 0 and result.global_step == EPOCHS * STEPS
    for got, want in zip(result.weights, undisturbed, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)


def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before(local_ray, tmp_path):
    layout, _ = LAYOUTS["in-graph"]
    ckpt = tmp_path / "ckpt"
    fit(layout, epochs=2, checkpoint_dir=str(ckpt))
    newest = ckpt / f"ckpt-{2 * STEPS}.data-00000-of-00001"
    assert newest.exists()
    with open(newest, "r+b") as f:  # a crash mid-write: the file cut short
        f.truncate(newest.stat().st_size // 2)
    resumed = fit(layout, epochs=3, checkpoint_dir=str(ckpt), resume=True)
    assert resumed.resumed_from == str(ckpt / f"ckpt-{STEPS}")
    assert resumed.epochs_trained == 2 and resumed.global_step == 3 * STEPS


class _ServerPid(raytf.Callback):
    """Hand parameter server 0's pid to the data hook that kills it."""

    def __init__(self, path):
        self.path = path

    def on_fit_start(self, run):
        with open(self.path, "w") as f:
            f.write(str(run.servers[0].pid))


def test_parameter_server_run_restarts_a_killed_server_and_replaces_a_killed_worker(
    local_ray, undisturbed, tmp_path
):
    # Synchronous: deterministic. One server, so a worker's push cannot be half delivered
    # when it dies (with several, a server that missed it closes that step without it).
    layout = raytf.ParameterServer(workers=2, ps=1)
    policy = raytf.FailurePolicy(max_failures=2, checkpoint_every_steps=EVERY)
    pid_file, marker = str(tmp_path / "ps-0.pid"), str(tmp_path / "worker-killed")
    # Worker 0's pipeline SIGKILLs server 0 at step 14 of epoch 2. In the restarted group
    # (at epoch 2, step r), worker 1 SIGKILLs itself at step 8 of epoch 3: its count starts
    # with its seek over r batches, so it is STEPS + 8.
    data = workloads.server_then_worker_data(pid_file, STEPS + 14, marker, STEPS + 8)
    result = fit(layout, data, failures=policy, callbacks=[_ServerPid(pid_file)])
    assert os.path.exists(pid_file + ".killed") and os.path.exists(marker)
    restarted, replaced = result.failures
    # The server's death restarted the group from the servers' newest mid-epoch
    # checkpoint: at most one interval redone.
    assert "ps-0" in restarted.error, result.failures
    assert restarted.action == "restarted the group"
    assert restarted.restored_epoch == 1 and restarted.restored_step >= EVERY
    assert "ps-0" in restarted.restored_checkpoint
    assert restarted.steps_redone <= EVERY
    # The worker was replaced while the servers and worker-0 ran on: nothing redone.
    assert replaced.worker == "worker-1" and replaced.action == "replaced in place"
    assert replaced.epoch == 2 and replaced.steps_redone == 0
    survivor = restarted.restarted_on[0]["pid"]
    assert [w.pid for w in result.workers] == [survivor, replaced.replacement["pid"]]
    assert result.global_step == EPOCHS * STEPS
    assert len(result.history["loss"]) == EPOCHS
    # Servers restored variables and Adam state mid-epoch, every worker's data went on from
    # the restored step, and the replacement from the dead worker's batch: the same model.
    for got, want in zip(result.weights, undisturbed, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert alive_actors() == []


def test_asynchronous_parameter_servers_train_on_while_a_worker_is_replaced(local_ray, tmp_path):
    layout = raytf.ParameterServer(workers=2, ps=1, staleness=None)
    marker = str(tmp_path / "worker-killed")
    result = fit(
        layout,
        workloads.dying_data(marker, 4, worker=1),
        failures=raytf.FailurePolicy(max_failures=1),
    )
    assert os.path.exists(marker)
    (failure,) = result.failures
    assert failure.action == "replaced in place" and failure.steps_redone == 0
    # Every worker batch of every epoch was applied or dropped once: none twice.
    (server,) = result.servers
    assert result.global_step == EPOCHS * STEPS * 2 == server.applied
    # Worker-0 did the dead worker's share while the replacement started: more than half.
    steps = [w.timing["steps"] for w in result.workers]
    assert steps[0] > EPOCHS * STEPS > steps[1], steps
    assert alive_actors() == []


class _KillTasks(raytf.Callback):
    """SIGKILL TensorFlow tasks by pid at epoch ends: ``{epoch: task name}``."""

    def __init__(self, plan):
        self.plan = plan

    def on_fit_start(self, run):
        self.pids = {row.name: row.pid for row in (*run.workers, *run.servers)}

    def on_epoch_end(self, epoch, logs):
        if epoch in self.plan:
            os.kill(self.pids[self.plan[epoch]], signal.SIGKILL)


def test_tensorflow_engine_restarts_lost_tasks(local_ray):
    layout = raytf.ParameterServer(
        workers=2, ps=1, staleness=None, backend="tensorflow", cpus_per_ps=0.5
    )
    epochs = 4
    # Both original workers are gone by epoch 3: it trains only if TensorFlow took the
    # restarted tasks back. Then the ps: its variables are lost, a restart from checkpoint.
    kills = _KillTasks({0: "worker-1", 1: "worker-0", 2: "ps-0"})
    result = fit(
        layout,
        epochs=epochs,
        failures=raytf.FailurePolicy(max_failures=3),
        callbacks=[kills],
        timeouts=raytf.Timeouts(epoch_s=120),  # a task TensorFlow never took back: fail
    )
    actions = [(f.worker, f.action) for f in result.failures]
    assert actions == [
        ("worker-1", "replaced in place"),
        ("worker-0", "replaced in place"),
        ("ps-0", "restarted the group"),
    ], result.failures
    assert result.failures[2].restored_epoch == 3  # the chief's checkpoint after epoch 3
    # Killed between epochs, so no closure was cut short: one step per worker batch.
    assert result.global_step == epochs * 2 * STEPS, result.failures
    assert len(result.history["loss"]) == epochs
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert alive_actors() == []

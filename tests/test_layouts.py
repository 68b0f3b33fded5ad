"""Every layout trains a real model on real Ray and matches Keras's own single-process fit."""

from __future__ import annotations

import os

import numpy as np
import pytest
import workloads
from conftest import alive_actors

import raytf

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EPOCHS, BATCH = 3, 64

LAYOUTS = {
    "towers": raytf.InGraph(devices=2, strategy="towers"),
    "mirrored": raytf.InGraph(devices=2, strategy="mirrored"),
    "all-reduce": raytf.AllReduce(workers=2),
    # Synchronous parameter servers average both workers' gradients: the same big batch.
    "ps-sync": raytf.ParameterServer(workers=2, ps=1),
}


@pytest.fixture(scope="module")
def reference(local_ray):
    """Keras's fit on the same batches, validating on every one of 133 examples."""
    task = local_ray.remote(max_calls=1)(workloads.call)
    history, weights = local_ray.get(
        task.remote(
            workloads.keras_fit_reference,
            EPOCHS,
            BATCH,
            validation_rows=workloads.VALIDATION_ROWS,
            n=workloads.LEFTOVER_EXAMPLES,
        )
    )
    return history["loss"], weights, history["val_loss"]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_trains_and_matches_single_process(local_ray, reference, name):
    """426 examples at batch 64 leave a remainder in every layout's batching (mirrored: 13
    per-replica batches for 6 two-replica steps). Every epoch must drop it, as Keras's fit
    with drop_remainder does, or epochs after the first see other examples than Keras's.
    Validation covers 133 examples: partial batches and uneven worker shards, all evaluated,
    so val_loss is Keras's. Towers reads data functions; the others NumPy arrays (the same
    rows: arrays are sharded as InputContext.shard shards)."""
    if name == "towers":
        data, validation = workloads.data_with_leftover, workloads.partial_validation
    else:
        data = workloads.arrays(workloads.LEFTOVER_EXAMPLES)
        validation = workloads.arrays(workloads.VALIDATION_ROWS, seed=1)
    result = raytf.fit(
        workloads.mlp,
        data,
        global_batch_size=BATCH,
        epochs=EPOCHS,
        layout=LAYOUTS[name],
        validation_data=validation,
        shuffle=False,
        verbose=False,
    )
    loss = result.history["loss"]
    assert loss[-1] < loss[0]
    assert set(result.history) >= {
        "loss",
        "accuracy",
        "val_loss",
        "val_accuracy",
        "examples_per_second",
    }
    # Same examples per step as Keras's fit, so the same trajectory up to float rounding.
    ref_loss, ref_weights, ref_val_loss = reference
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-4)
    np.testing.assert_allclose(result.history["val_loss"], ref_val_loss, rtol=1e-4)
    for got, want in zip(result.weights, ref_weights, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)
    assert result.global_step == EPOCHS * (workloads.LEFTOVER_EXAMPLES // BATCH)
    assert result.throughput and result.throughput > 0
    assert result.time_to_first_step_s and result.time_to_first_step_s > 0
    assert len(result.worker_throughput) == LAYOUTS[name].num_workers
    assert alive_actors() == []


def test_all_reduce_replicas_hold_identical_weights(local_ray):
    result = raytf.fit(
        workloads.mlp,
        workloads.data,
        global_batch_size=BATCH,
        epochs=1,
        layout="all-reduce",
        replicas=2,
        verbose=False,
    )
    prints = {w.fingerprint for w in result.workers}
    assert len(result.workers) == 2 and len(prints) == 1
    assert {w.name for w in result.workers} == {"worker-0", "worker-1"}


def test_dict_inputs_and_outputs_under_towers(local_ray):
    result = raytf.fit(
        workloads.dict_io_model,
        workloads.dict_io_data,
        global_batch_size=64,
        epochs=3,
        layout="towers",
        verbose=False,
    )
    assert {"loss", "cls_accuracy"} <= set(result.history)
    assert result.history["loss"][-1] < result.history["loss"][0]


def test_subclassed_batchnorm_under_mirrored(local_ray):
    result = raytf.fit(
        workloads.batchnorm_subclassed,
        workloads.data,
        global_batch_size=64,
        epochs=3,
        layout="mirrored",
        verbose=False,
    )
    assert result.history["loss"][-1] < result.history["loss"][0]
    # The moving statistics (non-trainable) moved away from their 0 / 1 initial values.
    local = workloads.batchnorm_subclassed()
    local(workloads.arrays(2)[0])
    names = [v.path for v in local.weights]
    moving_mean = result.weights[next(i for i, n in enumerate(names) if "moving_mean" in n)]
    moving_var = result.weights[next(i for i, n in enumerate(names) if "moving_variance" in n)]
    assert np.abs(moving_mean).max() > 1e-3 and np.abs(moving_var - 1).max() > 1e-3


def test_auto_on_one_cpu_node_picks_in_graph_and_says_why(local_ray):
    result = raytf.fit(
        workloads.mlp, workloads.data, global_batch_size=BATCH, epochs=1, verbose=False
    )
    assert result.layout == raytf.InGraph(devices=2, strategy="towers")
    assert "fit on one node" in result.explanation and "towers" in result.explanation


def test_checkpoint_then_resume_continues_from_the_saved_epoch(local_ray, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    common = dict(global_batch_size=BATCH, layout="all-reduce", replicas=2, verbose=False)
    whole = raytf.fit(workloads.mlp, workloads.data, epochs=4, **common)
    first = raytf.fit(workloads.mlp, workloads.data, epochs=2, checkpoint_dir=ckpt, **common)
    assert first.checkpoint and os.path.exists(first.checkpoint + ".index")
    assert not any(p.startswith(".scratch") for p in os.listdir(ckpt))
    resumed = raytf.fit(
        workloads.mlp, workloads.data, epochs=4, checkpoint_dir=ckpt, resume=True, **common
    )
    assert resumed.epochs_trained == 2 and len(resumed.history["loss"]) == 2
    steps = workloads.EXAMPLES // BATCH
    assert resumed.global_step == 4 * steps  # Adam's step counter came back too
    # Weights and Adam moments restored: the last two epochs match the uninterrupted run.
    np.testing.assert_allclose(resumed.history["loss"], whole.history["loss"][2:], rtol=1e-4)


def test_final_model_loads_as_keras_file(local_ray, tmp_path):
    result = raytf.fit(
        workloads.mlp,
        workloads.data,
        global_batch_size=BATCH,
        epochs=1,
        layout="towers",
        checkpoint_dir=str(tmp_path),
        verbose=False,
    )
    assert result.model_path == str(tmp_path / "model.keras")
    events = os.listdir(tmp_path / "summaries")  # the chief's TensorBoard scalars
    assert len(events) == 1 and events[0].startswith("events.out.tfevents")
    model = result.load_model()
    for got, want in zip(model.get_weights(), result.weights, strict=True):
        np.testing.assert_array_equal(got, want)
    fresh = workloads.mlp()
    fresh.set_weights(result.weights)
    x, _ = workloads.arrays(8)
    np.testing.assert_allclose(fresh(x), model(x), atol=1e-6)

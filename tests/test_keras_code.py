"""Keras code as it is: a model's own train_step/test_step, Keras callbacks, fit's options.

Each run is compared with Keras's own ``model.fit`` of the same code in one process, on the
same global batches: a step that was skipped, a learning rate that missed a replica or a
server, or a stop that came at another epoch would end on other weights.
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest
import workloads
from conftest import alive_actors

import raytf

pytestmark = [pytest.mark.ray, pytest.mark.slow]

EPOCHS, BATCH = 3, 64
STEPS = workloads.EXAMPLES // BATCH


def reference(ray, fn, *args, **kwargs):
    """Keras's own run of ``fn`` in a Ray worker (TensorFlow never runs in the test process).
    One worker serves every reference of the module: each sets its seeds and builds afresh,
    and the TensorFlow import is paid once."""
    return ray.get(ray.remote(workloads.call).remote(fn, *args, **kwargs))


def assert_same_weights(got, want):
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4)


@pytest.mark.parametrize(
    "layout",
    [
        # "auto" over two CPU devices is towers, which cannot run the step: mirrored does.
        pytest.param(raytf.InGraph(devices=2), id="in-graph-auto"),
        pytest.param(raytf.AllReduce(workers=2), id="all-reduce"),
    ],
)
def test_a_models_own_train_and_test_steps_run_as_in_keras_fit(local_ray, layout):
    ref_history, ref_weights = reference(local_ray, workloads.keras_custom_reference, EPOCHS, BATCH)
    result = raytf.fit(
        workloads.custom_step_model,
        workloads.data,
        global_batch_size=BATCH,
        epochs=EPOCHS,
        layout=layout,
        validation_data=workloads.validation,
        verbose=False,
    )
    # The model's metric counts every example of every replica, in training and evaluation.
    assert result.history["examples_seen"] == [float(STEPS * BATCH)] * EPOCHS
    assert result.history["val_examples_seen"] == [128.0] * EPOCHS
    np.testing.assert_allclose(result.history["accuracy"], ref_history["accuracy"], atol=1e-6)
    assert_same_weights(result.weights, ref_weights)  # the halved gradients were applied
    if layout.num_workers == 1:
        assert "MirroredStrategy instead" in result.explanation
    assert alive_actors() == []


def test_tensorflows_parameter_servers_run_a_models_own_step(local_ray):
    result = raytf.fit(
        workloads.custom_step_model,
        workloads.data,
        global_batch_size=BATCH,
        epochs=1,
        layout=raytf.ParameterServer(workers=1, ps=1, staleness=None, backend="tensorflow"),
        verbose=False,
    )
    assert result.history["examples_seen"] == [float(STEPS * BATCH)]


@pytest.mark.parametrize(
    "layout, names",
    [
        (raytf.ParameterServer(workers=2, ps=1), "ParameterServer(backend='ray')"),
        (raytf.InGraph(devices=2, strategy="towers"), "InGraph(strategy='towers')"),
    ],
    ids=["ray-ps", "towers"],
)
def test_layouts_that_cannot_run_a_models_own_step_refuse_it(local_ray, layout, names):
    with pytest.raises(raytf.ConfigError) as info:
        raytf.fit(
            workloads.custom_step_model,
            workloads.data,
            global_batch_size=BATCH,
            layout=layout,
            verbose=False,
        )
    message = str(info.value)
    assert "overrides train_step" in message and names in message
    assert "AllReduce" in message  # and where it does run
    assert alive_actors() == []


def test_keras_callbacks_all_reduce(local_ray, tmp_path):
    """A scheduler's rate on both workers, EarlyStopping on both at one epoch, writers once."""
    import keras

    ref_history, ref_weights = reference(
        local_ray, workloads.keras_fit_reference, 5, BATCH, "scheduler_callbacks"
    )
    scheduler, stopper = workloads.scheduler_callbacks()
    history = keras.callbacks.History()
    log = tmp_path / "log.csv"
    result = raytf.fit(
        workloads.mlp,
        workloads.data,
        global_batch_size=BATCH,
        epochs=5,
        layout=raytf.AllReduce(workers=2),
        callbacks=[
            scheduler,
            stopper,
            # Batch hooks on the chief alone: every worker must still read and agree alike.
            keras.callbacks.ProgbarLogger(),
            keras.callbacks.CSVLogger(str(log)),
            keras.callbacks.ModelCheckpoint(str(tmp_path / "model-{epoch}.keras")),
            history,
        ],
        verbose=False,
    )
    assert len(ref_history["loss"]) == 2  # Keras stopped after the second epoch
    assert result.epochs_trained == 2
    assert result.history["learning_rate"] == pytest.approx([0.01, 0.005])
    assert result.history["learning_rate"] == pytest.approx(ref_history["learning_rate"])
    assert_same_weights(result.weights, ref_weights)
    # Written once, by the chief: one row per epoch, one model per epoch.
    with open(log) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert sorted(os.listdir(tmp_path)) == ["log.csv", "model-1.keras", "model-2.keras"]
    saved = keras.models.load_model(tmp_path / "model-2.keras")
    assert_same_weights(saved.get_weights(), result.weights)
    # The user's own objects read as after model.fit.
    assert stopper.stopped_epoch == 1
    assert history.history["loss"] == pytest.approx(result.history["loss"])


def test_a_stop_mid_epoch_stops_every_all_reduce_worker_at_the_same_step(local_ray):
    import keras

    ref_history, ref_weights, ref_steps = reference(
        local_ray, workloads.keras_stop_reference, 3, BATCH, 2
    )
    result = raytf.fit(
        workloads.mlp,
        workloads.data,
        global_batch_size=BATCH,
        epochs=3,
        layout=raytf.AllReduce(workers=2),
        callbacks=[workloads.stop_at_batch(2), keras.callbacks.TerminateOnNaN()],
        steps_per_execution=1,
        verbose=False,
    )
    assert ref_steps == result.global_step == 3  # batches 0, 1, 2 of the first epoch
    assert result.epochs_trained == 1 and result.steps_trained == 3
    np.testing.assert_allclose(result.history["loss"], ref_history["loss"], rtol=1e-4)
    assert_same_weights(result.weights, ref_weights)


def test_keras_callbacks_parameter_servers(local_ray):
    """A scheduler's rate (epoch start) and ReduceLROnPlateau's (epoch end) reach the server
    before the next step; EarlyStopping stops every worker and the server at one epoch."""
    ref_history, ref_weights = reference(
        local_ray, workloads.keras_fit_reference, 6, BATCH, "rate_callbacks"
    )
    scheduler, plateau, stopper = workloads.rate_callbacks()
    result = raytf.fit(
        workloads.mlp,
        workloads.data,
        global_batch_size=BATCH,
        epochs=6,
        layout=raytf.ParameterServer(workers=2, ps=1),
        callbacks=[scheduler, plateau, stopper],
        verbose=False,
    )
    assert len(ref_history["loss"]) == result.epochs_trained == 3
    # 0.01 x 0.9 each epoch start, halved after the second and third epochs.
    assert ref_history["learning_rate"] == pytest.approx([0.009, 0.0081, 0.003645])
    assert result.history["learning_rate"] == pytest.approx(ref_history["learning_rate"])
    assert_same_weights(result.weights, ref_weights)
    assert stopper.stopped_epoch == 2


def test_class_weight_validation_freq_and_initial_epoch_mean_what_they_mean_in_keras(
    local_ray,
):
    options = {"class_weight": {0: 1.0, 1: 3.0, 2: 0.5}, "validation_freq": 2, "initial_epoch": 1}
    ref_history, ref_weights = reference(
        local_ray, workloads.keras_fit_reference, 4, BATCH, **options
    )
    result = raytf.fit(
        workloads.mlp,
        workloads.data,
        global_batch_size=BATCH,
        epochs=4,
        layout=raytf.InGraph(devices=2, strategy="towers"),
        validation_data=workloads.validation,
        verbose=False,
        **options,
    )
    assert result.epochs_trained == 3  # epochs 2..4
    assert len(result.history["val_loss"]) == len(ref_history["val_loss"]) == 2  # 2 and 4
    np.testing.assert_allclose(result.history["loss"], ref_history["loss"], rtol=1e-4)
    assert_same_weights(result.weights, ref_weights)


BF16_LAYOUTS = {
    "towers": raytf.InGraph(devices=2, strategy="towers"),
    "all-reduce": raytf.AllReduce(workers=2),
    "ps-ray": raytf.ParameterServer(workers=2, ps=1),
    "ps-tensorflow": raytf.ParameterServer(workers=1, ps=1, staleness=None, backend="tensorflow"),
}


@pytest.fixture(scope="module")
def bf16_reference(local_ray):
    return reference(local_ray, workloads.keras_bf16_reference, 2, BATCH)


@pytest.mark.parametrize("name", list(BF16_LAYOUTS))
def test_mixed_bfloat16_trains_in_every_layout(local_ray, bf16_reference, name):
    result = raytf.fit(
        workloads.bf16_mlp,
        workloads.data,
        global_batch_size=BATCH,
        epochs=2,
        layout=BF16_LAYOUTS[name],
        verbose=False,
    )
    ref_loss, ref_weights = bf16_reference
    assert result.load_model().layers[0].dtype_policy.name == "mixed_bfloat16"
    assert all(w.dtype == np.float32 for w in result.weights)  # float32 master weights
    # bfloat16 rounds activations to 8 bits of mantissa: close to Keras, not bit-equal.
    np.testing.assert_allclose(result.history["loss"], ref_loss, rtol=2e-2)
    for got, want in zip(result.weights, ref_weights, strict=True):
        np.testing.assert_allclose(got, want, atol=5e-2)

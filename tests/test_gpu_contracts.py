"""What would break on a real GPU cluster, checked with fake GPUs declared to Ray.

tensorflow-cpu sees no GPU here, so these tests pin the contracts a GPU cluster relies on:
the CPU stand-in is an explicit opt-in, a loss-scaled optimizer on parameter servers matches
Keras, and actors inside a caller's placement group (a Tune trial) take their own bundles.
Which GPUs each actor sees on a multi-node cluster is in test_multinode.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import workloads

import raytf

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_declared_gpus_tensorflow_cannot_see_are_refused_without_the_opt_in(
    ray_with_gpus, monkeypatch
):
    monkeypatch.delenv("RAYTF_CPU_STANDIN")
    with pytest.raises(raytf.ConfigError) as raised:
        raytf.fit(
            workloads.mlp,
            workloads.data,
            global_batch_size=64,
            layout=raytf.InGraph(devices=2, use_gpu=True),
            verbose=False,
        )
    text = str(raised.value)
    assert "given 2 GPU(s) by Ray" in text and "TensorFlow sees none" in text
    assert "raytf doctor" in text and "RAYTF_CPU_STANDIN=1" in text


def test_mixed_float16_parameter_servers_match_keras_across_loss_scale_changes(ray_with_gpus):
    epochs, batch = 2, 64  # 16 steps: the scale doubles every 3
    task = ray_with_gpus.remote(max_calls=1)(workloads.keras_mixed_reference)
    want_weights, want_scale = ray_with_gpus.get(task.remote(epochs, batch))
    assert want_scale >= workloads.INITIAL_SCALE * 2  # the run crossed scale changes
    result = raytf.fit(
        workloads.mixed_mlp,
        workloads.data,
        global_batch_size=batch,
        epochs=epochs,
        layout=raytf.ParameterServer(workers=2, ps=1, cpus_per_ps=0.5),
        verbose=False,
    )
    for got, want in zip(result.weights, want_weights, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-3)
    # The workers' scale is the servers': the saved model's optimizer holds the same one.
    model = result.load_model()
    assert float(model.optimizer.dynamic_scale.numpy()) == want_scale


def test_a_tune_trial_with_gpu_worker_bundles_and_a_server_starts_and_finishes(
    ray_with_gpus, tmp_path
):
    from ray import tune

    layout = raytf.ParameterServer(workers=2, ps=1, use_gpu=True)

    def trial(config):
        result = raytf.fit(
            workloads.mlp,
            workloads.data,
            global_batch_size=64,
            layout=layout,
            timeouts=raytf.Timeouts(start_s=90),
            verbose=False,
        )
        tune.report(
            {
                "loss": result.history["loss"][-1],
                "worker_gpus": [list(w.gpu_ids) for w in result.workers],
                "server_gpus": [list(s.gpu_ids) for s in result.servers],
                "server_cuda": [s.cuda_visible_devices for s in result.servers],
            }
        )

    # The trial's head bundle, then the layout's: GPU workers first, a CPU-only server last.
    resources = raytf.trial_resources(layout)
    assert resources.bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2 + [{"CPU": 1.0}]
    tuner = tune.Tuner(
        tune.with_resources(trial, resources),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    (outcome,) = tuner.fit()
    assert outcome.error is None, outcome.error
    metrics = outcome.metrics
    assert sorted(g for gpus in metrics["worker_gpus"] for g in gpus) == ["0", "1"]
    assert metrics["server_gpus"] == [[]] and metrics["server_cuda"] == [""]


def test_a_tune_trial_that_reserved_too_little_is_told_what_to_reserve(ray_with_gpus, tmp_path):
    from ray import tune

    def trial(config):
        raytf.fit(
            workloads.mlp,
            workloads.data,
            global_batch_size=64,
            layout=raytf.AllReduce(workers=2),
            verbose=False,
        )

    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": 1}),  # Tune's default: one CPU for the trial
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    )
    (outcome,) = tuner.fit()
    text = str(outcome.error)
    assert "PlacementError" in text and "reserved [{'CPU': 1.0}]" in text, text[-2000:]
    assert "raytf.trial_resources(layout=raytf.AllReduce(workers=2" in text

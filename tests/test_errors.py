"""Every error path a user can hit says what was received and how to fix it, and leaves no
actor behind."""

from __future__ import annotations

import socket

import pytest
import workloads
from conftest import alive_actors

import raytf
from raytf._internal.job import Job
from raytf._internal.runtime.controller import Controller

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def fit(model=workloads.mlp, data=workloads.data, **kwargs):
    args = dict(global_batch_size=64, epochs=1, layout="towers", verbose=False)
    return raytf.fit(model, data, **{**args, **kwargs})


@pytest.fixture(autouse=True)
def no_actor_survives(local_ray):
    yield
    assert alive_actors() == []


def test_exception_in_model_function_surfaces_with_traceback():
    with pytest.raises(raytf.WorkerError) as info:
        fit(model=workloads.model_that_raises, layout="all-reduce", replicas=2)
    err = info.value
    assert err.error_type == "KeyError" and "'encoder'" in str(err)
    assert err.worker in {"worker-0", "worker-1"}
    assert "model_that_raises" in err.remote_traceback  # the user's own frame


def test_model_function_not_returning_a_model():
    with pytest.raises(raytf.ConfigError, match=r"returned str .*expected a keras.Model"):
        fit(model=workloads.model_returning_string)


def test_uncompiled_model_without_loss():
    with pytest.raises(raytf.ConfigError, match="not compiled and no loss= was given"):
        fit(model=workloads.uncompiled)


def test_uncompiled_model_with_loss_argument_trains():
    result = fit(
        model=workloads.uncompiled,
        loss="sparse_categorical_crossentropy",
        optimizer="sgd",
        metrics=["accuracy"],
    )
    assert "accuracy" in result.history


def test_data_of_the_wrong_shape():
    with pytest.raises(raytf.ConfigError, match=r"shape \(7,\).*expects \(12,\)"):
        fit(data=workloads.data_wrong_width)


def test_data_already_batched():
    with pytest.raises(raytf.ConfigError, match="looks batched already"):
        fit(data=workloads.data_batched)


def test_data_function_returning_arrays():
    with pytest.raises(raytf.ConfigError, match=r"returned tuple, expected a tf\.data\.Dataset"):
        fit(data=workloads.data_numpy)


def test_batch_that_does_not_split_fails_before_any_actor():
    with pytest.raises(raytf.ConfigError, match="cannot be split evenly over 2 replicas"):
        fit(global_batch_size=63)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"layout": "ring"}, raytf.ConfigError, "Unknown layout 'ring'"),
        ({"layout": "all-reduce", "replicas": 0}, raytf.ConfigError, "replicas must be a positive"),
        ({"layout": "auto", "replicas": 0}, raytf.ConfigError, "replicas must be a positive"),
        ({"layout": "auto", "replicas": 8}, raytf.PlacementError, "can never be placed"),
        ({"layout": "auto", "use_gpu": True}, raytf.PlacementError, "no GPUs"),
        ({"callbacks": [print]}, raytf.ConfigError, "Callback or raytf.Callback instances"),
        ({"runtime_env": "."}, raytf.ConfigError, r"runtime_env must be a dict .*working_dir"),
        ({"runtime_env": {"working_dir": "/no/such"}}, raytf.ConfigError, "does not exist"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        fit(**kwargs)


def test_resources_held_elsewhere_time_out_with_a_clear_error(local_ray):
    hog = local_ray.remote(num_cpus=3)(type("Hog", (), {"ping": lambda self: 1})).remote()
    local_ray.get(hog.ping.remote())  # 1 of 4 CPUs left, all-reduce wants 2
    try:
        with pytest.raises(raytf.PlacementError, match="held by other actors"):
            fit(layout="all-reduce", replicas=2, timeouts=raytf.Timeouts(placement_s=2))
    finally:
        local_ray.kill(hog)


class _PhantomPeer(raytf.AllReduce):
    """All-reduce whose cluster spec names one more worker than there are actors."""

    def strategy_specs(self, addresses):
        with socket.socket() as s:  # a port nobody serves: the peer never arrives
            s.bind(("127.0.0.1", 0))
            phantom = f"127.0.0.1:{s.getsockname()[1]}"
        specs = raytf.AllReduce(workers=self.workers + 1).strategy_specs([*addresses, phantom])
        return specs[:-1]


def test_missing_peer_fails_within_the_timeout():
    job = Job(model_fn=workloads.mlp, data_fn=workloads.data, global_batch_size=64)
    controller = Controller(
        _PhantomPeer(workers=2), job, raytf.Timeouts(peers_s=5), "test: a phantom third worker"
    )
    with pytest.raises(raytf.StartupTimeoutError, match="did not finish 'peers' within 5s"):
        controller.run()


def test_optimizer_and_metric_objects_are_rebuilt_inside_the_scope():
    import keras

    result = fit(
        model=workloads.uncompiled,
        layout="mirrored",
        loss=keras.losses.SparseCategoricalCrossentropy(),
        optimizer=keras.optimizers.Adam(0.01),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
        epochs=2,
    )
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert 0 < result.history["acc"][-1] <= 1


def test_use_gpu_disagreeing_with_a_layout_object():
    with pytest.raises(raytf.ConfigError, match="use_gpu=True disagrees with the layout"):
        fit(layout=raytf.InGraph(devices=2), use_gpu=True)


def test_resuming_a_finished_run_says_so(tmp_path):
    fit(epochs=1, checkpoint_dir=str(tmp_path))
    with pytest.raises(raytf.ConfigError, match="at epoch 1, and epochs=1: nothing is left"):
        fit(epochs=1, checkpoint_dir=str(tmp_path), resume=True)


def test_user_functions_in_a_module_the_actors_cannot_import(tmp_path, monkeypatch):
    """The driver imports the user's package from its own directory; Ray's workers do not
    run there. The error names the module and the fix, and the fix (runtime_env) works."""
    package = tmp_path / "raytf_user_models"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import numpy as np\n"
        "import keras\n"
        "import tensorflow as tf\n\n"
        "def build_model():\n"
        "    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])\n"
        "    model.compile(optimizer='sgd', loss='mse')\n"
        "    return model\n\n"
        "def make_dataset(ctx):\n"
        "    x = np.ones((128, 4), 'float32')\n"
        "    return ctx.shard(tf.data.Dataset.from_tensor_slices((x, x[:, :2])))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import raytf_user_models as user

    with pytest.raises(raytf.ConfigError) as raised:
        fit(model=user.build_model, data=user.make_dataset)
    text = str(raised.value)
    assert "cannot import 'raytf_user_models'" in text and "py_modules" in text
    result = fit(
        model=user.build_model,
        data=user.make_dataset,
        runtime_env={"py_modules": [str(package)]},
    )
    assert result.global_step == 128 // 64

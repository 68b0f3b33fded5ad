"""Data as users have it: Ray Data and Parquet files (NumPy arrays: test_layouts.py), each
checked, each trained on with real Ray Data and TensorFlow and compared with the tf.data
function path; evaluate and predict against Keras's own."""

from __future__ import annotations

import numpy as np
import pytest
import workloads
from conftest import alive_actors

import raytf

pytestmark = [pytest.mark.ray]

EPOCHS, BATCH = 2, 64


@pytest.fixture(scope="module")
def reference(local_ray):
    """Keras's fit on the same data (NumPy arrays against Keras itself: test_layouts.py)."""
    task = local_ray.remote(workloads.call)
    return local_ray.get(task.remote(workloads.keras_reference, EPOCHS, BATCH))


def fit(data, layout, **kwargs):
    return raytf.fit(
        workloads.mlp,
        data,
        global_batch_size=BATCH,
        epochs=EPOCHS,
        layout=layout,
        verbose=False,
        **kwargs,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "source, layout",
    [
        ("streaming", raytf.AllReduce(workers=2)),
        ("materialized", raytf.ParameterServer(workers=2, ps=1)),
        ("parquet", raytf.InGraph(devices=2)),
        ("tfrecords", raytf.InGraph(devices=2)),
    ],
    ids=[
        "ray-data-streaming-all-reduce",
        "ray-data-materialized-ps",
        "parquet-in-graph",
        "tfrecords-in-graph",
    ],
)
def test_ray_data_and_files_train_like_the_function_path(
    local_ray, reference, tmp_path, source, layout
):
    if source == "parquet":
        data = workloads.write_parquet(tmp_path)
    elif source == "tfrecords":  # x comes back as a float_list: a list column
        task = local_ray.remote(workloads.call)  # TensorFlow writes them, in a worker
        data = local_ray.get(task.remote(workloads.write_tfrecords, str(tmp_path)))
    else:  # a lazy transform streams through Ray Data again every epoch
        data = workloads.ray_dataset()
        data = data if source == "materialized" else data.map_batches(workloads.same)
    result = fit(data, layout, feature_columns="x", label_columns="y")
    # Ray Data splits by blocks, not every n-th row: other batches, the same data and steps.
    assert result.global_step == EPOCHS * (workloads.EXAMPLES // BATCH)
    ref_loss = reference[0]
    loss = result.history["loss"]
    assert loss[-1] < loss[0]
    np.testing.assert_allclose(loss, ref_loss, rtol=0.1)
    assert alive_actors() == []


def test_arrays_of_different_lengths_are_refused_before_ray_starts():
    x, y = workloads.arrays()
    with pytest.raises(raytf.ConfigError, match=r"different lengths \{'x': 512, 'y': 500\}"):
        fit((x, y[:500]), "all-reduce")
    with pytest.raises(raytf.ConfigError, match="expected a NumPy array"):
        fit((x, list(y)), "all-reduce")


def test_ray_data_and_file_mistakes_are_named(local_ray, tmp_path):
    ds = workloads.ray_dataset()
    columns = {"feature_columns": "x", "label_columns": "y"}
    with pytest.raises(raytf.ConfigError, match=r"\['z'\].*has \['x', 'y'\]"):
        fit(ds, "all-reduce", feature_columns="z", label_columns="y")
    with pytest.raises(raytf.ConfigError, match="pass feature_columns= and label_columns="):
        fit(ds, "all-reduce")
    with pytest.raises(raytf.ConfigError, match="fewer rows than one global batch"):
        fit(workloads.ray_dataset(40), "all-reduce", feature_columns="x", label_columns="y")
    with pytest.raises(raytf.ConfigError, match="no readable file"):
        fit(str(tmp_path / "missing-*.parquet"), "all-reduce", feature_columns="x")
    lazy = ds.map_batches(workloads.same)
    with pytest.raises(raytf.ConfigError, match="Materialize it"):
        fit(lazy, raytf.ParameterServer(workers=2, ps=1, staleness=None), **columns)
    with pytest.raises(raytf.ConfigError, match="Materialize it"):
        fit(lazy, "all-reduce", failures=raytf.FailurePolicy(max_failures=1), **columns)
    with pytest.raises(raytf.ConfigError, match="backend='tensorflow'"):
        fit(
            ds,
            raytf.ParameterServer(workers=1, ps=1, staleness=None, backend="tensorflow"),
            feature_columns="x",
            label_columns="y",
        )
    assert alive_actors() == []


@pytest.mark.slow
def test_evaluate_and_predict_equal_keras_on_one_process(local_ray, tmp_path):
    keras_task = local_ray.remote(workloads.call)
    path = local_ray.get(
        keras_task.remote(workloads.keras_trained_model, str(tmp_path / "model.keras"))
    )
    # 133 rows: a partial last batch of 32 on each of 2 workers, which Keras evaluates too.
    x, y = workloads.arrays(133, seed=2)
    ref_metrics, ref_predictions = local_ray.get(
        keras_task.remote(workloads.keras_score_reference, path, x, y, 32)
    )

    metrics = raytf.evaluate(path, (x, y))
    assert metrics.keys() == ref_metrics.keys() == {"loss", "accuracy"}
    for key in metrics:
        assert metrics[key] == pytest.approx(ref_metrics[key], rel=1e-5)
    predictions = raytf.predict(path, x)
    np.testing.assert_allclose(predictions, ref_predictions, atol=1e-5)

    # A Ray Dataset: every row evaluated, and a predictions column for every row.
    ds = workloads.ray_dataset(133, seed=2)
    metrics = raytf.evaluate(path, ds, feature_columns="x", label_columns="y")
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-5)
    rows = raytf.predict(path, ds, feature_columns="x").take_all()
    assert len(rows) == 133
    index = {row.tobytes(): i for i, row in enumerate(x)}
    for row in rows:
        want = ref_predictions[index[np.asarray(row["x"], "float32").tobytes()]]
        np.testing.assert_allclose(row["predictions"], want, atol=1e-5)
    assert alive_actors() == []


def test_scoring_mistakes_are_named(local_ray, tmp_path):
    with pytest.raises(raytf.ConfigError, match=r"path of a \.keras file"):
        raytf.evaluate(str(tmp_path / "missing.keras"), workloads.arrays())
    with pytest.raises(raytf.ConfigError, match="batch_size must be a positive integer"):
        raytf.predict(str(tmp_path / "x.keras"), workloads.arrays()[0], batch_size=0)

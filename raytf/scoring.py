"""Distributed scoring: :func:`evaluate` and :func:`predict` on the cluster's workers.

Both take the model a run produced (a :class:`~raytf.FitResult` or a ``.keras`` path) and data
in any form ``fit`` takes. Evaluation keeps every example (the last partial batch too) and
merges the workers' metric state, so it equals Keras's ``model.evaluate`` on one process;
prediction returns the rows in their order (NumPy in, NumPy out), or, for a Ray Dataset, a
Ray Dataset with a ``predictions`` column computed by an actor pool (``map_batches``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from raytf._internal import inputs
from raytf._internal.checks import positive_int, positive_number
from raytf._internal.ray_data_input import _columns as columns
from raytf._internal.ray_data_input import _is_ray_dataset as is_ray_dataset
from raytf.data import InputContext
from raytf.errors import ConfigError, RaytfError

#: Keras's default batch size for evaluate and predict.
BATCH_SIZE = 32


def _model_bytes(model: Any) -> bytes:
    from raytf.result import FitResult

    path = model.model_path if isinstance(model, FitResult) else model
    if isinstance(model, FitResult) and path is None:
        raise RaytfError(
            "This run's final model could not be saved as a .keras file (see "
            "result.workers' model_save_error), so it cannot be scored on the cluster."
        )
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ConfigError(
            f"model must be a raytf.FitResult or the path of a .keras file, received "
            f"{model!r:.100}."
        )
    with open(path, "rb") as f:
        return f.read()


def _scorers(workers: int, runtime_env: dict[str, Any] | None) -> Any:
    from raytf._internal.runtime import runtime_env as renv
    from raytf._internal.runtime.group import ActorGroup
    from raytf._internal.runtime.pool import POOL
    from raytf._internal.worker.scorer import Scorer

    POOL.make_room(cpus=float(workers))  # warm actors must not keep the scorers waiting
    group = ActorGroup(None, [{"CPU": 1.0}] * workers, renv.for_actors(runtime_env))
    for i in range(workers):
        group.spawn(f"scorer-{i}", "scorer", i, Scorer)
    return group


def _over_shards(
    group: Any, method: str, model_bytes: bytes, data_fn: Any, batch_size: int, timeout_s: float
) -> list[Any]:
    """Every scorer loads the model, then runs ``method`` over its shard of ``data_fn``."""
    members, workers = group.members, len(group.members)
    group.call(members, "load", [(model_bytes,)] * workers, timeout_s=timeout_s, phase="start")
    contexts = [
        InputContext(
            worker_index=i,
            num_workers=workers,
            replicas_per_worker=1,
            global_batch_size=batch_size * workers,
            training=False,
        )
        for i in range(workers)
    ]
    args = [(data_fn, ctx, batch_size) for ctx in contexts]
    return group.call(members, method, args, timeout_s=timeout_s, phase="epoch")


def _check(batch_size: int, workers: int, timeout_s: float) -> None:
    positive_int("batch_size", batch_size, "Keras's default is 32.")
    positive_int("workers", workers, "One scoring actor per worker, one CPU each.")
    positive_number("timeout_s", timeout_s, "Seconds for the whole pass.")


def evaluate(
    model: Any,
    data: Any,
    *,
    batch_size: int = BATCH_SIZE,
    workers: int = 2,
    feature_columns: str | Sequence[str] | None = None,
    label_columns: str | Sequence[str] | None = None,
    sample_weight_column: str | None = None,
    address: str | None = None,
    timeout_s: float = 600.0,
    runtime_env: dict[str, Any] | None = None,
) -> dict[str, float]:
    """The model's loss and metrics on ``data`` (arrays ``(x, y[, sample_weight])``, a data
    function, a Ray Dataset or files), computed by ``workers`` actors; as
    ``model.evaluate(..., return_dict=True)`` computes them on one process."""
    from raytf._internal.runtime import runtime_env as renv
    from raytf.api import connect

    _check(batch_size, workers, timeout_s)
    renv.check(runtime_env)
    columns = (feature_columns, label_columns, sample_weight_column)
    data_fn = inputs.as_data_fn(data, "data", *columns)
    if data_fn is None:
        raise ConfigError("evaluate needs data: (x, y) arrays, a function, a Ray Dataset or files.")
    model_bytes = _model_bytes(model)
    connect(address)
    data_fn = inputs.ship(data_fn, workers, equal=False)  # every row, none dropped
    group = _scorers(workers, runtime_env)
    try:
        members = group.members
        states = _over_shards(group, "evaluate", model_bytes, data_fn, batch_size, timeout_s)
        if not any(states):
            raise ConfigError("evaluate got data with no rows.")
        # On a scorer that saw rows: its compiled metrics are built, as every state's are.
        merger = [m for m, s in zip(members, states) if s][:1]
        return group.call(merger, "merge", [(states,)], timeout_s=timeout_s, phase="final")[0]
    finally:
        group.shutdown()


class _Predictor:
    """``map_batches``'s callable class: the model once per actor, a batch per call."""

    def __init__(self, model_bytes: Any, features: Any) -> None:
        import tempfile

        import keras
        import ray

        if isinstance(model_bytes, ray.ObjectRef):  # put once by the driver, read per actor
            model_bytes = ray.get(model_bytes)

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.keras")
            with open(path, "wb") as f:
                f.write(model_bytes)
            self.model = keras.models.load_model(path)
        self.features = features

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        f = self.features
        x = batch[f] if isinstance(f, str) else {c: batch[c] for c in f}
        batch["predictions"] = np.asarray(self.model.predict_on_batch(x))
        return batch


def predict(
    model: Any,
    x: Any,
    *,
    batch_size: int = BATCH_SIZE,
    workers: int = 2,
    feature_columns: str | Sequence[str] | None = None,
    address: str | None = None,
    timeout_s: float = 600.0,
    runtime_env: dict[str, Any] | None = None,
) -> Any:
    """Predictions for ``x``: NumPy in (an array or a dict of arrays), NumPy out in the same
    row order; a Ray Dataset in, a Ray Dataset out with a ``predictions`` column (lazy:
    computed by an actor pool of ``workers`` as you consume it)."""
    from raytf._internal.runtime import runtime_env as renv
    from raytf.api import connect

    _check(batch_size, workers, timeout_s)
    renv.check(runtime_env)
    model_bytes = _model_bytes(model)
    if is_ray_dataset(x):
        if feature_columns is None:
            raise ConfigError(
                f"predict on a Ray Dataset needs feature_columns= (its columns: {x.columns()})."
            )
        columns(feature_columns, "feature_columns", x.columns() or [])
        import ray

        connect(address)
        return x.map_batches(
            _Predictor,
            fn_constructor_args=(ray.put(model_bytes), feature_columns),
            batch_size=batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_cpus=1,
            runtime_env=renv.for_actors(runtime_env),
        )
    data_fn = inputs.features_input(x, "x")
    connect(address)
    data_fn = inputs.ship(data_fn, workers)
    group = _scorers(workers, runtime_env)
    try:
        parts = _over_shards(group, "predict", model_bytes, data_fn, batch_size, timeout_s)
    finally:
        group.shutdown()
    return _interleave(parts, data_fn.rows)


def _interleave(parts: list[Any], rows: int) -> Any:
    """Worker i scored rows i, i+n, ...: put them back in order."""
    import numpy as np

    n = len(parts)  # workers; one with no rows (fewer rows than workers) sent None
    some = next(p for p in parts if p is not None)

    def merge(pieces: list[Any]) -> Any:
        first = next(p for p in pieces if p is not None)
        out = np.empty((rows, *first.shape[1:]), dtype=first.dtype)
        for i, piece in enumerate(pieces):
            if piece is not None:
                out[i::n] = piece
        return out

    def pick(key: Any) -> list[Any]:
        return [None if p is None else p[key] for p in parts]

    if isinstance(some, dict):
        return {k: merge(pick(k)) for k in some}
    if isinstance(some, (list, tuple)):
        return type(some)(merge(pick(i)) for i in range(len(some)))
    return merge(parts)

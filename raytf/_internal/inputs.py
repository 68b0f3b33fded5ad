"""What ``data=`` and ``validation_data=`` may be, each turned into raytf's one form: a data
function (InputContext -> this worker's unbatched ``tf.data.Dataset``), so every layout reads
every kind of input alike, with the same batching and epoch rules.

- a function: as it is;
- NumPy arrays, as ``model.fit`` takes them: ``(x, y)`` or ``(x, y, sample_weight)``, where x
  and y are arrays or dicts of arrays. The driver puts them in Ray's object store once (not
  once per actor); each worker reads its every ``num_workers``-th example, as
  ``InputContext.shard`` picks them, from a zero-copy view of the stored arrays;
- a ``ray.data.Dataset``: split across the workers in equal shares and fed to TensorFlow a
  batch at a time (no Python per example). A materialized dataset (in the object store) is
  split into fixed shards that each worker caches after its first epoch; any other streams
  through Ray Data's streaming split, executed again every epoch (per-epoch shuffles stay);
  ``feature_columns``/``label_columns`` (a name: a tensor; a list: a dict) say which is which;
- files: a path, a glob or a list of Parquet or TFRecord files, read through Ray Data.

Checks run in the driver before any actor starts; shipping (``ship``) happens once Ray is up.
This module imports neither TensorFlow nor Ray Data until a worker or the driver needs them.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from raytf._internal.ray_data_input import (
    FileInput,
    RayDataInput,
    _is_ray_dataset,
    file_input,
    ray_data_input,
)
from raytf.errors import ConfigError


# ------------------------------------------------------------------------- NumPy arrays
def _is_array(value: Any) -> bool:
    import numpy as np

    return isinstance(value, np.ndarray)


def _leaves(value: Any, name: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [(f"{name}[{k!r}]", v) for k, v in value.items()]
    return [(name, value)]


@dataclasses.dataclass(frozen=True)
class ArrayInput:
    """``(x, y[, sample_weight])`` arrays; after :meth:`shipped`, a reference to them."""

    arrays: Any = dataclasses.field(default=None, repr=False)
    ref: Any = None
    rows: int = 0
    #: Shuffle the worker's rows every epoch (Keras's fit(shuffle=True) for arrays).
    shuffle: bool = False

    def shipped(self) -> ArrayInput:
        import ray

        return dataclasses.replace(self, arrays=None, ref=ray.put(self.arrays))

    def __call__(self, ctx: Any) -> Any:
        import ray
        import tensorflow as tf

        arrays = ray.get(self.ref) if self.ref is not None else self.arrays
        i, n = ctx.worker_index, ctx.num_workers
        part = tf.nest.map_structure(lambda a: a[i::n], arrays)  # InputContext.shard's pick
        ds = tf.data.Dataset.from_tensor_slices(part)
        if self.shuffle and ctx.training:
            rows = len(tf.nest.flatten(part)[0])
            ds = ds.shuffle(rows, seed=ctx.seed, reshuffle_each_iteration=True)
        return ds


def array_input(data: tuple, what: str) -> ArrayInput:
    """Check ``data`` as model.fit would: (x, y) or (x, y, sample_weight), equal lengths."""
    if len(data) not in (2, 3):
        raise ConfigError(
            f"{what} got a tuple of {len(data)} arrays, expected (x, y) or "
            "(x, y, sample_weight) as model.fit takes them."
        )
    names = ("x", "y", "sample_weight")
    leaves = [leaf for part, name in zip(data, names) for leaf in _leaves(part, name)]
    for name, value in leaves:
        if not _is_array(value):
            raise ConfigError(
                f"{what}: {name} is a {type(value).__name__}, expected a NumPy array (or a dict "
                "of them); convert it with np.asarray."
            )
        if value.ndim == 0:
            raise ConfigError(f"{what}: {name} is a scalar; expected one row per example.")
    lengths = {name: len(value) for name, value in leaves}
    if len(set(lengths.values())) > 1:
        raise ConfigError(
            f"{what}: the arrays have different lengths {lengths}; every array needs one row "
            "per example."
        )
    arrays = tuple(
        {k: v for k, v in part.items()} if isinstance(part, dict) else part for part in data
    )
    return ArrayInput(arrays=arrays, rows=next(iter(lengths.values())))


# ------------------------------------------------------------------------- any input
def as_data_fn(
    data: Any,
    what: str,
    feature_columns: Any = None,
    label_columns: Any = None,
    sample_weight_column: str | None = None,
) -> Any:
    """``data`` as a data function (or None), checked."""
    if data is None or (callable(data) and not _is_ray_dataset(data)):
        return data
    if (
        isinstance(data, (tuple, list))
        and data
        and (_is_array(data[0]) or isinstance(data[0], dict))
    ):
        return array_input(tuple(data), what)
    if _is_ray_dataset(data):
        return ray_data_input(data, what, feature_columns, label_columns, sample_weight_column)
    if isinstance(data, (str, os.PathLike)) or (
        isinstance(data, (list, tuple)) and data and all(isinstance(p, str) for p in data)
    ):
        paths = tuple(file_input(data, what))
        return FileInput(paths, what, (feature_columns, label_columns, sample_weight_column))
    raise ConfigError(
        f"{what} got {type(data).__name__}; expected a function (InputContext -> unbatched "
        "tf.data.Dataset), NumPy arrays (x, y) or (x, y, sample_weight), a ray.data.Dataset "
        "with feature_columns=/label_columns=, or Parquet/TFRecord file paths."
    )


def ship(fn: Any, workers: int, equal: bool = True) -> Any:
    """The data function as actors receive it: arrays by reference, Ray Data split (in
    ``equal`` shares for training, every row for evaluation)."""
    if isinstance(fn, (FileInput, RayDataInput)):  # Ray Data reads in Ray tasks
        from raytf._internal.runtime.pool import POOL

        POOL.make_room(cpus=1.0)
    if isinstance(fn, FileInput):
        fn = fn.read()
    if isinstance(fn, ArrayInput) and fn.ref is None:
        return fn.shipped()
    if isinstance(fn, RayDataInput) and not fn.iterators:
        return fn.shipped(workers, equal)
    return fn


def features_input(x: Any, what: str) -> ArrayInput:
    """``x`` alone (an array or a dict of arrays), as ``model.predict`` takes it."""
    leaves = _leaves(x, "x")
    for name, value in leaves:
        if not _is_array(value) or value.ndim == 0:
            raise ConfigError(
                f"{what}: {name} is a {type(value).__name__}, expected a NumPy array of one "
                "row per example (or a dict of them)."
            )
    lengths = {name: len(value) for name, value in leaves}
    if len(set(lengths.values())) > 1:
        raise ConfigError(f"{what}: the arrays have different lengths {lengths}.")
    rows = len(leaves[0][1])
    if not rows:
        raise ConfigError(f"{what} has no rows: nothing to predict.")
    return ArrayInput(arrays=(dict(x) if isinstance(x, dict) else x,), rows=rows)


def _lazy(fn: Any) -> bool:
    """A Ray Dataset read through the streaming split (executed again every epoch)."""
    if isinstance(fn, RayDataInput):
        return fn.streaming and type(fn.dataset).__name__ != "MaterializedDataset"
    return isinstance(fn, FileInput) and not fn.materializes()


def check_for_layout(fn: Any, what: str, layout: Any, failures: Any) -> None:
    """What a layout or failure policy cannot read, refused before anything is shipped."""
    ray_data = isinstance(fn, (RayDataInput, FileInput))
    if ray_data and getattr(layout, "resolved_backend", None) == "tensorflow":
        raise ConfigError(
            f"{what}: a Ray Dataset or files cannot feed ParameterServer(backend="
            "'tensorflow'): TensorFlow sends the input pipeline to its workers as a graph. "
            "Use backend='ray', or pass a data function."
        )
    if ray_data and failures.elastic:
        raise ConfigError(
            f"{what}: an elastic FailurePolicy (min_workers=...) changes the worker count, "
            "which a Ray Dataset split per worker cannot follow yet; pass a data function or "
            "NumPy arrays, or drop min_workers."
        )
    if not _lazy(fn):
        return
    if getattr(layout, "staleness", 0) != 0:
        raise ConfigError(
            f"{what}: a lazy Ray Dataset (streamed again every epoch) cannot feed "
            "asynchronous or bounded-staleness parameter servers: a faster worker would "
            "wait at Ray Data's epoch barrier for the others. Materialize it "
            "(ds.materialize()) or use staleness=0."
        )
    if failures.max_failures:
        raise ConfigError(
            f"{what}: a lazy Ray Dataset (streamed again every epoch) cannot be read again "
            "by restarted workers yet. Materialize it (ds.materialize()) to recover from "
            "failures, or drop failures=."
        )


def check_rows(fn: Any, what: str, layout: Any, global_batch_size: int) -> None:
    """Training data too small for one global batch, refused before any actor starts."""
    rows = getattr(fn, "rows", None)
    if isinstance(fn, (ArrayInput, RayDataInput)) and rows is not None:
        usable = rows // layout.num_workers * layout.num_workers
        if usable < global_batch_size:
            raise ConfigError(
                f"{what} has {rows} rows, fewer rows than one global batch of "
                f"{global_batch_size} over {layout.num_workers} worker(s); use a smaller "
                "global_batch_size or more data."
            )

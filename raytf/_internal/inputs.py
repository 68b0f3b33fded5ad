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
import glob
import os
from collections.abc import Callable, Sequence
from typing import Any

from raytf.errors import ConfigError

#: Rows a worker asks Ray Data for at a time: one Python call per this many examples.
RAY_DATA_BATCH = 1024
#: Files whose size is under this share of the cluster's object store are read once and
#: kept there (materialized), so epochs after the first read memory, not the files.
MATERIALIZE_SHARE = 0.25
FILE_KINDS = {".parquet": "parquet", ".tfrecord": "tfrecords", ".tfrecords": "tfrecords"}


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


# ------------------------------------------------------------------------- Ray Data
@dataclasses.dataclass(frozen=True)
class RayDataInput:
    """A Ray Dataset's columns as ``(features, labels[, weights])``; after :meth:`shipped`,
    one shard (materialized input) or streaming-split iterator per worker."""

    dataset: Any = dataclasses.field(default=None, repr=False)
    features: str | tuple[str, ...] = ()
    labels: str | tuple[str, ...] = ()
    weights: str | None = None
    #: Column -> (shape of one row's value, dtype name), read from the first row.
    specs: dict[str, tuple[tuple[int, ...], str]] = dataclasses.field(default_factory=dict)
    rows: int = 0
    iterators: tuple[Any, ...] = ()
    #: Equal shares (training: every worker steps alike) or every row (evaluation).
    equal: bool = True
    streaming: bool = True

    @property
    def restartable_in_place(self) -> bool:
        """A streaming reader replaced alone would wait at the split's epoch barrier for the
        others: then a lost worker restarts the whole group instead."""
        return not self.streaming

    def shipped(self, workers: int, equal: bool = True) -> RayDataInput:
        if type(self.dataset).__name__ == "MaterializedDataset":
            shards = self.dataset.split(workers, equal=equal)  # fixed blocks, no coordinator
            return dataclasses.replace(
                self, dataset=None, iterators=tuple(shards), equal=equal, streaming=False
            )
        iterators = self.dataset.streaming_split(workers, equal=equal)
        return dataclasses.replace(self, dataset=None, iterators=tuple(iterators), equal=equal)

    def _structure(self, columns: Any, get: Callable[[str], Any]) -> Any:
        if isinstance(columns, str):
            return get(columns)
        return {c: get(c) for c in columns}

    def __call__(self, ctx: Any) -> Any:
        import tensorflow as tf

        if len(self.iterators) != ctx.num_workers:
            raise ConfigError(
                f"A Ray Dataset split for {len(self.iterators)} worker(s) was read by "
                f"{ctx.num_workers}: a run that changes its worker count (an elastic "
                "FailurePolicy) cannot use Ray Data input yet; pass a data function."
            )
        iterator = self.iterators[ctx.worker_index]

        def spec(column: str) -> tf.TensorSpec:
            shape, dtype = self.specs[column]
            return tf.TensorSpec((None, *shape), tf.as_dtype(dtype))

        parts = [self.features, self.labels] + ([self.weights] if self.weights else [])
        signature = tuple(self._structure(p, spec) for p in parts)

        def column(batch: dict[str, Any], name: str) -> Any:
            values = batch[name]
            if values.dtype == object:  # list columns (TFRecord float_list): one array
                import numpy as np

                return np.stack(list(values))
            return values

        def batches() -> Any:
            for batch in iterator.iter_batches(
                batch_size=RAY_DATA_BATCH, batch_format="numpy", prefetch_batches=2
            ):
                yield tuple(self._structure(p, lambda c, b=batch: column(b, c)) for p in parts)

        ds = tf.data.Dataset.from_generator(batches, output_signature=signature).unbatch()
        if not self.streaming:  # a fixed shard: from memory after the first epoch
            ds = ds.cache()
        if not self.equal:
            return ds
        # Equal shares: every worker's epoch has this many rows, so epochs have known steps.
        return ds.apply(tf.data.experimental.assert_cardinality(self.rows // ctx.num_workers))


def _columns(value: Any, name: str, available: Sequence[str]) -> str | tuple[str, ...]:
    if isinstance(value, str):
        wanted: list[str] = [value]
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        wanted = list(value)
    else:
        raise ConfigError(
            f"{name} must be a column name or a list of them, received {value!r}; the dataset "
            f"has columns {list(available)}."
        )
    missing = [c for c in wanted if c not in available]
    if missing:
        raise ConfigError(
            f"{name} names column(s) {missing} that the Ray Dataset does not have; it has "
            f"{list(available)}."
        )
    return value if isinstance(value, str) else tuple(value)


def ray_data_input(
    dataset: Any, what: str, features: Any, labels: Any, weights: str | None
) -> RayDataInput:
    """Check the columns and read one row for the tensors' shapes and dtypes."""
    import numpy as np

    columns = list(dataset.columns() or [])
    if features is None or labels is None:
        raise ConfigError(
            f"{what} is a Ray Dataset with columns {columns}: pass feature_columns= and "
            "label_columns= (a name for one tensor, a list for a dict of tensors)."
        )
    feats = _columns(features, "feature_columns", columns)
    labs = _columns(labels, "label_columns", columns)
    if weights is not None:
        _columns(weights, "sample_weight_column", columns)
    rows = dataset.count()
    first = dataset.take(1)
    if not first:
        raise ConfigError(f"{what} is an empty Ray Dataset.")
    specs = {}
    for column, value in first[0].items():
        array = np.asarray(value)
        if array.dtype == object:
            continue  # not a tensor column; refused below if it is used
        specs[column] = (tuple(array.shape), array.dtype.name)
    used = [*(feats if isinstance(feats, tuple) else [feats])]
    used += [*(labs if isinstance(labs, tuple) else [labs])] + ([weights] if weights else [])
    bad = [c for c in used if c not in specs]
    if bad:
        raise ConfigError(
            f"{what}: column(s) {bad} do not hold numbers (e.g. strings or ragged lists); "
            "map them to fixed-shape numeric arrays with Dataset.map_batches first."
        )
    return RayDataInput(dataset, feats, labs, weights, specs, rows)


def file_input(paths: Any, what: str) -> list[str]:
    """Expand a path, a glob or a list of them; every file must exist (local paths)."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    found: list[str] = []
    for item in map(str, items):
        if "://" in item:
            found.append(item)  # a remote URI: Ray Data reads and checks it
            continue
        matches = sorted(glob.glob(item)) if glob.has_magic(item) else [item]
        if not matches or not all(os.path.isfile(m) for m in matches):
            raise ConfigError(
                f"{what}: no readable file at {item!r}. Pass Parquet or TFRecord files: a "
                "path, a glob ('data/*.parquet') or a list of paths."
            )
        found.extend(matches)
    kinds = {FILE_KINDS.get(os.path.splitext(p)[1].lower()) for p in found}
    if len(kinds) != 1 or None in kinds:
        raise ConfigError(
            f"{what}: files must all be Parquet (.parquet) or all TFRecord (.tfrecord), "
            f"received {found[:5]}."
        )
    return found


@dataclasses.dataclass(frozen=True)
class FileInput:
    """Checked file paths, read through Ray Data once Ray is up (:func:`ship`)."""

    paths: tuple[str, ...]
    what: str
    columns: tuple[Any, Any, str | None]

    def __call__(self, ctx: Any) -> Any:  # pragma: no cover - shipped before any actor
        raise ConfigError("File input must be shipped (raytf.fit does it) before it is read.")

    def materializes(self) -> bool:
        """Local files that fit easily in the object store are read once and kept there."""
        import ray

        if any("://" in p for p in self.paths):
            return False
        store = ray.cluster_resources().get("object_store_memory", 0)
        return sum(os.path.getsize(p) for p in self.paths) < MATERIALIZE_SHARE * store

    def read(self) -> RayDataInput:
        """Read through Ray Data (once, if :meth:`materializes`)."""
        dataset = read_files(list(self.paths))
        if self.materializes():
            dataset = dataset.materialize()
        return ray_data_input(dataset, self.what, *self.columns)


def read_files(paths: list[str]) -> Any:
    import ray.data

    kind = FILE_KINDS[os.path.splitext(paths[0])[1].lower()]
    return getattr(ray.data, f"read_{kind}")(paths)


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


def _is_ray_dataset(data: Any) -> bool:
    return type(data).__module__.startswith("ray.data") and hasattr(data, "streaming_split")


def ship(fn: Any, workers: int, equal: bool = True) -> Any:
    """The data function as actors receive it: arrays by reference, Ray Data split (in
    ``equal`` shares for training, every row for evaluation)."""
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

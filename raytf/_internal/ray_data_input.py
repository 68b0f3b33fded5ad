"""Ray Data and files as raytf input: a Ray Dataset's columns fed to TensorFlow a batch at
a time, split over the workers (fixed cached shards when materialized, Ray Data's streaming
split otherwise), and Parquet/TFRecord paths read through Ray Data. See inputs.py for how
every kind of input becomes a data function; this module imports Ray Data only when used.
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


def _is_ray_dataset(data: Any) -> bool:
    return type(data).__module__.startswith("ray.data") and hasattr(data, "streaming_split")


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

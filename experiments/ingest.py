"""Ingest: raytf's throughput per input kind on the MLP workload, all-reduce over 2 workers.

The same 8192 examples (784 floats, an int label) reach the workers as a tf.data function,
NumPy arrays, a Ray Dataset (materialized: cached by each worker after its first epoch; or
lazy: streamed again every epoch), and Parquet files read through Ray Data; the model, batch (256)
and layout are the benchmark's. Each row is the median of ``--repeats`` runs of
``result.throughput`` (steady examples/s, tracing excluded), against the tf.data function.

    python experiments/ingest.py                 # 3 repeats, 4 epochs each
    python experiments/ingest.py --repeats 1 --epochs 2 --markdown
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
from functools import partial
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchmark  # the benchmark's workload, batch and seeds
from ray import cloudpickle

cloudpickle.register_pickle_by_value(benchmark)  # actors cannot import experiments/

KINDS = (
    "tf.data function",
    "NumPy arrays",
    "Ray Data (materialized)",
    "Ray Data (streaming)",
    "Parquet files",
)


def function_data(ctx: Any) -> Any:
    import tensorflow as tf

    x, y = benchmark.make_arrays("mlp")
    return ctx.shard(tf.data.Dataset.from_tensor_slices((x, y)))


def _same(batch: Any) -> Any:
    return batch


def inputs(directory: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    import ray.data

    x, y = benchmark.make_arrays("mlp")
    ds = ray.data.from_items([{"x": a, "y": int(b)} for a, b in zip(x, y)]).materialize()
    ds.repartition(8).write_parquet(directory)
    columns = {"feature_columns": "x", "label_columns": "y"}
    return {
        "tf.data function": (function_data, {}),
        "NumPy arrays": ((x, y), {}),
        "Ray Data (materialized)": (ds, columns),
        # A lazy transform: executed again every epoch through the streaming split.
        "Ray Data (streaming)": (ds.map_batches(_same), columns),
        "Parquet files": (f"{directory}/*.parquet", columns),
    }


def run(data: Any, options: dict[str, Any], epochs: int) -> float:
    import raytf

    result = raytf.fit(
        partial(benchmark.build_model, "mlp", "sgd"),
        data,
        global_batch_size=benchmark.GLOBAL_BATCH,
        epochs=epochs,
        layout=raytf.AllReduce(workers=2),
        verbose=False,
        seed=benchmark.MODEL_SEED,
        **options,
    )
    return float(result.throughput or 0.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)

    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level=logging.ERROR)
    rates: dict[str, list[float]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        given = inputs(tmp)
        for _ in range(args.repeats):  # interleaved: drift on a shared machine hits all alike
            for kind in KINDS:
                data, options = given[kind]
                rates[kind].append(run(data, options, args.epochs))
                print(f"  {kind}: {rates[kind][-1]:,.0f} ex/s", file=sys.stderr, flush=True)
    ray.shutdown()
    base = statistics.median(rates[KINDS[0]])
    header = ["input", "examples/s (median)", "runs", "vs tf.data function"]
    rows = []
    for kind in KINDS:
        median = statistics.median(rates[kind])
        runs = ", ".join(f"{r:,.0f}" for r in rates[kind])
        rows.append([kind, f"{median:,.0f}", runs, f"{median / base:.2f}x"])
    table = benchmark.markdown_table if args.markdown else benchmark.plain_table
    print(table(header, rows))


if __name__ == "__main__":
    main()

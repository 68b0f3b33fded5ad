"""How long from ``raytf.fit(...)`` to the first training step: the first call, and the next
calls in the same driver, with warm actors (the default) and without (``keep_warm(0)``).

    python experiments/startup.py                  # all-reduce, 2 workers, 4 calls each way
    python experiments/startup.py --layout towers --calls 3 --gap 5 --markdown

Between calls the driver waits ``--gap`` seconds (default 10), as a user reading the result
would, in both series: warm actors start importing TensorFlow when a run ends.

``time_to_first_step_s`` is measured by raytf from the call to the moment the slowest worker
finished its first step (model built, strategy wired, the step traced and run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

FEATURES, CLASSES, EXAMPLES, BATCH = 784, 10, 4096, 256


def build_model() -> Any:
    import keras

    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def make_data(ctx: Any) -> Any:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=EXAMPLES)
    return ctx.shard(tf.data.Dataset.from_tensor_slices((x, y)))


def calls(layout: str, n: int, warm: bool, gap: float) -> list[tuple[float, float]]:
    """(seconds to the first step, wall seconds) of ``n`` fit calls in a row."""
    import raytf

    raytf.keep_warm(60 if warm else 0)
    out = []
    for i in range(n):
        if i:
            time.sleep(gap)  # the user reads the result
        t0 = time.perf_counter()
        result = raytf.fit(
            build_model, make_data, layout=layout, global_batch_size=BATCH, epochs=1, verbose=False
        )
        out.append((result.time_to_first_step_s or float("nan"), time.perf_counter() - t0))
    raytf.keep_warm(0)  # release before the next series
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", default="all-reduce")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--gap", type=float, default=10.0, help="seconds between calls")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
    rows = []
    for warm in (False, True):
        series = calls(args.layout, args.calls, warm, args.gap)
        first, rest = series[0], series[1:]
        rows.append(
            (
                "warm actors (default)" if warm else "keep_warm(0)",
                first[0],
                statistics.median(s[0] for s in rest),
                statistics.median(s[1] for s in rest),
            )
        )
    ray.shutdown()
    head = ("driver", "1st call: first step s", "later calls: first step s", "later calls: wall s")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for name, a, b, c in rows:
            print(f"| {name} | {a:.2f} | {b:.2f} | {c:.2f} |")
    else:
        print(f"{args.layout}, {args.calls} calls per series, medians of the later calls")
        print(f"{head[0]:<24}{head[1]:>26}{head[2]:>28}{head[3]:>22}")
        for name, a, b, c in rows:
            print(f"{name:<24}{a:>26.2f}{b:>28.2f}{c:>22.2f}")


if __name__ == "__main__":
    main()

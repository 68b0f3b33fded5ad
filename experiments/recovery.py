"""Kill a worker at a random step, over and over, and count how many runs recover.

Each trial trains a small MLP with ``raytf.fit`` under a ``FailurePolicy``; worker 1 (or the
in-graph actor) sends itself SIGKILL via its pid when its data pipeline reaches a step drawn at
random. The table gives runs recovered out of runs tried, and the seconds from the kill to the
driver noticing and to training again.

    python experiments/recovery.py                      # 10 trials per layout
    python experiments/recovery.py --trials 20 --layouts all-reduce
    python experiments/recovery.py --layouts ps-sync,ps-async   # replaced in place

Parameter-server layouts replace the dead worker in place while the servers run on (the
``how`` column); the others restart the group from the newest checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from functools import partial
from typing import Any

FEATURES, CLASSES, EXAMPLES, BATCH = 32, 4, 2048, 64


def build_model() -> Any:
    import keras

    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def make_data(ctx: Any, marker: str, at_step: int, victim: int) -> Any:
    """Synthetic examples; worker ``victim`` SIGKILLs itself at ``at_step``, once."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + 2 * (x[:, 1] > 0).astype("int64")
    ds = ctx.shard(tf.data.Dataset.from_tensor_slices((x, y)))
    if ctx.worker_index != victim:
        return ds
    at = at_step * ctx.worker_batch_size
    seen = [0]  # examples this process produced, across passes over the data

    def maybe_die(i):  # no annotations: AutoGraph reads this function's source
        seen[0] += 1
        if seen[0] - 1 == at and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        return i

    def watched(i, example):
        token = tf.py_function(maybe_die, [i], tf.int64)
        with tf.control_dependencies([token]):
            return tf.identity(example[0]), example[1]

    return ds.enumerate().map(watched)


def trial(layout_name: str, at_step: int, args: argparse.Namespace) -> dict[str, Any]:
    import raytf

    # (layout, victim, optimizer steps per data step: asynchronous servers count each
    # worker's batch)
    layout, victim, per_step = {
        "in-graph": (raytf.InGraph(devices=2, strategy="towers"), 0, 1),
        "all-reduce": (raytf.AllReduce(workers=2), 1, 1),
        "ps-sync": (raytf.ParameterServer(workers=2, ps=1), 1, 1),
        "ps-async": (raytf.ParameterServer(workers=2, ps=1, staleness=None), 1, 2),
    }[layout_name]
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "killed")
        try:
            result = raytf.fit(
                build_model,
                partial(make_data, marker=marker, at_step=at_step, victim=victim),
                global_batch_size=BATCH,
                epochs=args.epochs,
                layout=layout,
                failures=raytf.FailurePolicy(
                    max_failures=2, checkpoint_every_steps=args.checkpoint_every
                ),
                verbose=args.verbose,
            )
        except Exception as exc:  # a run that did not recover is a result, not a crash
            return {"recovered": False, "error": f"{type(exc).__name__}: {exc}"[:200]}
        killed_at = None
        if os.path.exists(marker):
            with open(marker) as f:
                killed_at = float(f.read())
    steps = args.epochs * (EXAMPLES // BATCH) * per_step
    ok = result.global_step == steps and len(result.failures) == 1 and killed_at is not None
    failure = result.failures[0] if result.failures else None
    return {
        "recovered": ok,
        "detect_s": failure.detected_at - killed_at if ok else None,
        "training_again_s": failure.detected_at + failure.recovery_s - killed_at if ok else None,
        "steps_redone": result.steps_redone,
        "action": failure.action if failure else None,
        "wall_s": result.wall_time_s,
    }


def _stat(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=10, help="trials per layout")
    p.add_argument("--layouts", default="in-graph,all-reduce")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--checkpoint-every", type=int, default=8, help="steps between checkpoints")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", action="store_true", help="raytf's progress lines per trial")
    args = p.parse_args(argv)
    import ray

    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=args.verbose,  # the raylet reports every kill; the table says enough
    )
    rng = random.Random(args.seed)
    steps = args.epochs * (EXAMPLES // BATCH)
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"{args.trials} trials per layout; {steps} steps per run; checkpoint every "
        f"{args.checkpoint_every} steps; SIGKILL at a random step in 2..{steps - 2}"
    )
    rows = []
    for name in args.layouts.split(","):
        results = []
        for i in range(args.trials):
            at = rng.randint(2, steps - 2)
            r = trial(name, at, args)
            results.append(r)
            state = "recovered" if r["recovered"] else f"FAILED {r.get('error', '')}"
            print(f"  {name} trial {i + 1}: kill at step {at}: {state}", file=sys.stderr)
        ok = [r for r in results if r["recovered"]]
        rows.append(
            [
                name,
                f"{len(ok)}/{len(results)}",
                _stat([r["detect_s"] for r in ok]),
                _stat([r["training_again_s"] for r in ok]),
                _stat([float(r["steps_redone"]) for r in ok]),
                ",".join(sorted({str(r["action"]) for r in ok})) or "-",
            ]
        )
    ray.shutdown()
    header = [
        "layout",
        "recovered",
        "kill -> detected s",
        "kill -> training again s",
        "redone",
        "how",
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    for line in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(line, widths)))
    print("median (min-max) over the runs that recovered; 'redone': steps trained twice (at most)")


if __name__ == "__main__":
    main()

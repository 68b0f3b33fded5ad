"""What a parameter-server step pays for, piece by piece: the transfer floor and the update.

Transfer: a server actor holding the real ShardProtocol (raytf's consistency rules) with a
NumPy update, and worker actors that push a gradient of the model's size and get the new
weights back, with no compute: the floor under a step, for each transport.
- "object-store": the push and its answer as Ray actor calls (arrays through the object store);
- "tcp": the same through raytf's WireServer and TcpChannel (raytf's default).
One worker alone, then two in synchronous steps (each step waits for both pushes).

Update: the server's Adam step over the README's MLP, as a traced tf.function and as one XLA
computation (what raytf's server runs when XLA can lower the optimizer), one CPU thread.

    python experiments/ps_wire.py                 # 4 KB, the README MLP's 1.08 MB, 4x that
    python experiments/ps_wire.py --bytes 1077288 --steps 100 --markdown

With several sizes it fits ``ms = per call + per MB x MB`` for each transport (one worker):
the cost model's per-call and per-byte figures (docs/communication.md).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from typing import Any

import numpy as np

MLP = [(784, 256), (256, 256), (256, 10)]
SIZE = sum(i * o + o for i, o in MLP)  # float32 values in the MLP (1,077,288 bytes)


class Server:
    """A shard with the real protocol and a NumPy update; Ray calls and TCP both reach it."""

    def __init__(self, workers: int, size: int) -> None:
        from raytf._internal.backends.ray_ps.protocol import ShardProtocol

        self.weights = np.zeros(size, np.float32)

        def apply(flat: Any) -> None:
            self.weights -= 0.01 * flat

        self.protocol = ShardProtocol(workers, 0, 0, apply=apply, values=self.weights.copy)

    async def listen(self) -> str:
        from raytf._internal.backends.ray_ps.wire import WireServer

        self.wire = WireServer(self.protocol, "ps-0")
        return await self.wire.start()

    async def push(self, worker: int, version: int, flat: Any, want: bool, generation: int):
        return await self.protocol.push(worker, version, flat, want, generation)

    async def noop(self) -> None:
        return None


class Worker:
    def run(
        self, transport: str, server: Any, address: str, index: int, steps: int, size: int
    ) -> dict[str, float]:
        import ray

        from raytf._internal.backends.ray_ps.wire import open_channels

        (channel,) = open_channels(transport, [server], ["ps-0"], [address], f"worker-{index}")
        grad = np.ones(size, np.float32)
        times, version = [], 0
        for _ in range(steps):
            t0 = time.perf_counter()
            version, _, _ = channel.push(index, version, grad, True, 0).result()
            times.append(time.perf_counter() - t0)
        calls = []
        for _ in range(steps):
            t0 = time.perf_counter()
            ray.get(server.noop.remote())
            calls.append(time.perf_counter() - t0)
        warm = steps // 10
        return {
            "step_ms": 1000 * statistics.median(times[warm:]),
            "call_ms": 1000 * statistics.median(calls[warm:]),
        }


def transfer(sizes: list[int], steps: int) -> list[dict[str, Any]]:
    import ray

    ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.ERROR)
    rows = []
    try:
        for size in sizes:
            for workers in (1, 2):
                for transport in ("object-store", "tcp"):
                    server = ray.remote(num_cpus=0)(Server).remote(workers, size)
                    address = ray.get(server.listen.remote())
                    actors = [ray.remote(num_cpus=0)(Worker).remote() for _ in range(workers)]
                    out = ray.get(
                        [
                            a.run.remote(transport, server, address, i, steps, size)
                            for i, a in enumerate(actors)
                        ]
                    )
                    rows.append(
                        {
                            "bytes": 4 * size,
                            "transport": transport,
                            "workers": workers,
                            "step_ms": statistics.median(o["step_ms"] for o in out),
                            "call_ms": statistics.median(o["call_ms"] for o in out),
                        }
                    )
                    for actor in (server, *actors):
                        ray.kill(actor)
    finally:
        ray.shutdown()
    return rows


def fit_costs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Least squares ``ms = per call + per MB x MB`` per transport, one worker."""
    out = []
    for transport in ("object-store", "tcp"):
        mine = [
            (r["bytes"] / 1e6, r["step_ms"])
            for r in rows
            if r["transport"] == transport and r["workers"] == 1
        ]
        if len({mb for mb, _ in mine}) < 2:
            continue
        xs, ys = np.array([m for m, _ in mine]), np.array([t for _, t in mine])
        per_mb, per_call = np.polyfit(xs, ys, 1)
        out.append({"transport": transport, "per_call_ms": per_call, "per_mb_ms": per_mb})
    return out


def _adam_step(optimizer: Any, variables: list[Any], sizes: list[int]) -> Any:
    import tensorflow as tf

    def apply(flat: Any) -> None:
        parts = tf.split(flat, sizes)
        optimizer.apply_gradients([(tf.reshape(p, v.shape), v) for p, v in zip(parts, variables)])

    return apply


def update(steps: int) -> list[dict[str, Any]]:
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    shapes = [s for i, o in MLP for s in ((i, o), (o,))]
    sizes = [int(np.prod(s)) for s in shapes]
    flat = np.random.default_rng(0).random(sum(sizes), dtype=np.float32)
    rows = []
    for xla in (False, True):
        variables = [keras.Variable(np.zeros(s, np.float32)) for s in shapes]
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(variables)

        fn = tf.function(_adam_step(optimizer, variables, sizes), jit_compile=xla)
        t0 = time.perf_counter()
        fn(flat)
        first = time.perf_counter() - t0
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn(flat)
            times.append(time.perf_counter() - t0)
        rows.append(
            {
                "update": "XLA" if xla else "tf.function",
                "ms": 1000 * statistics.median(times),
                "first_s": first,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--bytes",
        type=int,
        nargs="+",
        default=[4096, SIZE * 4, SIZE * 16],
        help="gradient sizes in bytes (default: 4 KB, the MLP's 1.08 MB, 4x that)",
    )
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    if min(args.bytes) < 4 or args.steps < 10:
        p.error("--bytes must be >= 4 and --steps >= 10")
    print(f"command: {' '.join(['python', *sys.argv])}")
    rows = transfer([b // 4 for b in args.bytes], args.steps)
    print("\nTransfer floor: a push of this size and the weights back, no compute")
    print(f"{'MB':>6} {'transport':<13} {'workers':>7} {'ms/step':>8} {'empty call ms':>14}")
    for r in rows:
        print(
            f"{r['bytes'] / 1e6:>6.2f} {r['transport']:<13} {r['workers']:>7} "
            f"{r['step_ms']:>8.2f} {r['call_ms']:>14.2f}"
        )
    costs = fit_costs(rows)
    if costs:
        print("\nFit, one worker: ms per step = per call + per MB pushed (and pulled back)")
        for c in costs:
            print(
                f"{c['transport']:<13} per call {c['per_call_ms']:.2f} ms, "
                f"per MB {c['per_mb_ms']:.2f} ms"
            )
    updates = update(args.steps)
    print("\nServer update: Adam over the MLP's 1.08 MB, one CPU thread")
    print(f"{'update':<12} {'ms':>6} {'first call s':>13}")
    for r in updates:
        print(f"{r['update']:<12} {r['ms']:>6.2f} {r['first_s']:>13.2f}")
    if args.markdown:
        print(
            "\n| MB pushed (and pulled back) | transport | workers | ms per step "
            "| empty actor call, ms |"
        )
        print("|---:|---|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['bytes'] / 1e6:.3g} | {r['transport']} | {r['workers']} "
                f"| {r['step_ms']:.2f} | {r['call_ms']:.2f} |"
            )
        if costs:
            print("\n| transport | per call ms | per MB ms |\n|---|---:|---:|")
            for c in costs:
                print(f"| {c['transport']} | {c['per_call_ms']:.2f} | {c['per_mb_ms']:.2f} |")
        print("\n| server update | ms | first call s |\n|---|---:|---:|")
        for r in updates:
            print(f"| {r['update']} | {r['ms']:.2f} | {r['first_s']:.2f} |")


if __name__ == "__main__":
    main()

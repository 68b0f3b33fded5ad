"""Benchmark one workload through bare TensorFlow, raytf's loop by hand, raytf, Ray Train.

Every runner runs in a fresh subprocess, because TensorFlow's devices and multi-worker
strategies can be configured only once per process, and so no runner inherits another's warm
caches. The child prints one JSON line; the parent collects them into one table whose
throughput ratios (against ``bare-tf``) are what to compare: absolute figures on a shared
2-core machine drift by about +-25% between runs.

    python experiments/benchmark.py                        # both workloads, all runners
    python experiments/benchmark.py --workload mlp --steps 20 --epochs 2 --runners bare-tf
    python experiments/benchmark.py --markdown             # also a Markdown table
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from importlib import metadata
from typing import Any

GLOBAL_BATCH = 256
NUM_EXAMPLES = 8192  # distinct synthetic examples per workload; the dataset repeats
DATA_SEED = 1234
MODEL_SEED = 0
RESULT_MARKER = "BENCHMARK_RESULT "
WORKLOADS = ("mlp", "cnn")
# Defaults sized so both workloads x 7 runners take roughly 5-8 minutes on 2 cores:
# the fixed costs (TF import, Ray start, actors, Ray Train's ~10 s start) dominate.
DEFAULT_STEPS = {"mlp": 400, "cnn": 100}


@dataclass(frozen=True)
class Runner:
    key: str
    label: str
    needs_ray: bool


RUNNERS = (
    Runner("bare-tf", "bare-tf (1 dev)", False),
    Runner("loop-towers", "loop by hand (towers, 2 dev)", False),
    Runner("loop-mirrored", "loop by hand (mirrored, 2 dev)", False),
    # The same, in a process where Ray merely runs (idle): what Ray's daemons cost on this node.
    Runner("loop-towers-ray", "loop by hand (towers) + idle Ray", True),
    Runner("loop-mirrored-ray", "loop by hand (mirrored) + idle Ray", True),
    Runner("raytf-towers", "raytf in-graph towers", True),
    Runner("raytf-mirrored", "raytf in-graph mirrored", True),
    Runner("raytf-allreduce", "raytf all-reduce 2w", True),
    Runner("ray-train", "ray-train TensorflowTrainer 2w", True),
    # Parameter servers, 2 workers: raytf's backend in each mode, then TensorFlow's backend.
    Runner("ps-sync-1", "raytf PS sync, 1 ps", True),
    Runner("ps-sync-1-store", "raytf PS sync, 1 ps, object store", True),
    Runner("ps-sync-2", "raytf PS sync, 2 ps", True),
    Runner("ps-backup-1", "raytf PS sync + 1 backup, 1 ps", True),
    Runner("ps-stale2-1", "raytf PS staleness 2, 1 ps", True),
    Runner("ps-async-1", "raytf PS async, 1 ps", True),
    Runner("ps-async-1-store", "raytf PS async, 1 ps, object store", True),
    Runner("ps-async-2", "raytf PS async, 2 ps", True),
    Runner("ps-async-1-noprefetch", "raytf PS async, 1 ps, no prefetch", True),
    Runner("ps-stale2-1-noprefetch", "raytf PS staleness 2, 1 ps, no prefetch", True),
    Runner("ps-tf-1", "TF backend PS async, 1 ps", True),
    Runner("ps-tf-2", "TF backend PS async, 2 ps", True),
)
GROUPS = {
    "core": [r.key for r in RUNNERS if not r.key.startswith("ps-")],
    # The parameter-server table: all-reduce as the reference, then every PS backend and mode.
    "ps": ["raytf-allreduce"] + [r.key for r in RUNNERS if r.key.startswith("ps-")],
}
RUNNER_BY_KEY = {r.key: r for r in RUNNERS}
# (raytf row, loop-by-hand row): the "raytf within 5% of its loop by hand" claim.
PAIRS = (
    ("raytf-towers", "loop-towers"),
    ("raytf-mirrored", "loop-mirrored"),
    ("raytf-towers", "loop-towers-ray"),
    ("raytf-mirrored", "loop-mirrored-ray"),
)


# --------------------------------------------------------------------- workloads (child)
def build_model(workload: str, optimizer: str) -> Any:
    """Build and compile the workload's model; raytf calls this inside the strategy scope."""
    import keras

    if workload == "mlp":
        layers = [
            keras.Input((784,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10),
        ]
    elif workload == "cnn":
        layers = [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(10),
        ]
    else:
        raise ValueError(f"unknown workload {workload!r}")
    model = keras.Sequential(layers, name=workload)
    opt = (
        keras.optimizers.Adam(1e-3)
        if optimizer == "adam"
        else keras.optimizers.SGD(0.01, momentum=0.9)
    )
    # No compiled metrics: bare-tf tracks only the loss, so every runner does the same work.
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def make_arrays(workload: str) -> tuple[Any, Any]:
    """Synthetic float32 features and int32 labels, identical in every process (fixed seed)."""
    import numpy as np

    rng = np.random.default_rng(DATA_SEED)
    shape = (NUM_EXAMPLES, 784) if workload == "mlp" else (NUM_EXAMPLES, 28, 28, 1)
    x = rng.standard_normal(shape, dtype=np.float32)
    y = rng.integers(0, 10, size=NUM_EXAMPLES, dtype=np.int32)
    return x, y


def make_data(workload: str, ctx: Any, straggler_ms: float = 0.0) -> Any:
    """raytf data function: this worker's shard, unbatched, repeated (epochs use steps_per_epoch).

    The arrays are made here, not closed over, so Ray ships a small function, not 25 MB.
    ``straggler_ms`` slows worker 1 by that much per batch: a slower machine among equals.
    """
    import tensorflow as tf

    x, y = make_arrays(workload)
    ds = ctx.shard(tf.data.Dataset.from_tensor_slices((x, y))).repeat()
    if not straggler_ms or ctx.worker_index != 1:
        return ds
    every = ctx.worker_batch_size

    def pause(i: Any) -> Any:
        if int(i) % every == 0:
            time.sleep(straggler_ms / 1000)
        return i

    def slowed(i: Any, example: Any) -> Any:
        token = tf.py_function(pause, [i], tf.int64)
        with tf.control_dependencies([token]):
            return tf.identity(example[0]), example[1]

    return ds.enumerate().map(slowed)


def _job(args: argparse.Namespace) -> Any:
    from raytf._internal.job import Job

    return Job(
        model_fn=partial(build_model, args.workload, args.optimizer),
        data_fn=partial(make_data, args.workload),
        global_batch_size=GLOBAL_BATCH,
        epochs=args.epochs,
        steps_per_epoch=args.steps,
        steps_per_execution=args.spe,
        seed=MODEL_SEED,
    )


# ----------------------------------------------------------------------- runners (child)
def run_bare_tf(args: argparse.Namespace) -> dict[str, Any]:
    """The baseline: a hand-written custom loop on one device, shaped like raytf's loop.

    Same data pipeline, K steps per tf.function call and a first call of one step (tracing),
    so the only difference to the loop is what raytf adds.
    """
    import keras
    import tensorflow as tf

    t0 = time.time()
    keras.utils.set_random_seed(MODEL_SEED)
    model = build_model(args.workload, args.optimizer)
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)  # create slots before tracing
    x, y = make_arrays(args.workload)
    ds = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(GLOBAL_BATCH, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    iterator = iter(ds)
    mean_loss = keras.metrics.Mean()

    @tf.function
    def train_n(iterator: Any, n: tf.Tensor) -> tf.Tensor:
        for _ in tf.range(n):
            xb, yb = next(iterator)
            with tf.GradientTape() as tape:
                y_pred = model(xb, training=True)
                loss = model.compute_loss(x=xb, y=yb, y_pred=y_pred, training=True)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            mean_loss.update_state(loss, sample_weight=tf.shape(xb)[0])
        return n

    first_step_at = None
    steady_steps, steady_s = 0, 0.0
    for _ in range(args.epochs):
        mean_loss.reset_state()
        done = 0
        while done < args.steps:
            n = 1 if first_step_at is None else min(args.spe, args.steps - done)
            t = time.perf_counter()
            train_n(iterator, tf.constant(n)).numpy()
            if first_step_at is None:
                first_step_at = time.time()
            else:
                steady_steps += n
                steady_s += time.perf_counter() - t
            done += n
    wall = time.time() - t0
    return {
        "throughput": steady_steps * GLOBAL_BATCH / steady_s if steady_s else None,
        "first_step_s": first_step_at - t0 if first_step_at else None,
        "wall_s": wall,
        "loss": float(mean_loss.result()),
    }


def run_loop(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """raytf's loop in this process, no Ray: what raytf in-graph should match within 5%."""
    from raytf._internal.spec import StrategySpec
    from raytf._internal.worker.loop import run_in_process

    job = _job(args)
    t0 = time.time()  # TensorFlow is imported already: raytf's actors import it before fit too
    loop, epochs = run_in_process(StrategySpec(kind=kind, devices=2), job)
    wall = time.time() - t0
    first = loop.runner.clock.first_step_at
    return {
        "throughput": loop.throughput,
        "first_step_s": first - t0 if first else None,
        "wall_s": wall,
        "loss": epochs[-1]["logs"]["loss"],
    }


def _start_ray(num_cpus: int) -> None:
    import ray

    # address="local": never join a cluster someone else (a test suite) started.
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        logging_level=logging.ERROR,
        log_to_driver=False,
    )


def _ps_layout(key: str) -> Any:
    """``ps-<mode>-<servers>[-noprefetch|-store]`` as a raytf.ParameterServer for 2 workers
    (``-store``: weights and gradients through Ray's object store, not TCP)."""
    import raytf

    parts = key.split("-")
    mode, servers = parts[1], int(parts[2])
    options: dict[str, Any] = {"staleness": 0}
    if mode == "backup":
        options["backup_workers"] = 1
    elif mode == "stale2":
        options["staleness"] = 2
    elif mode in ("async", "tf"):
        options["staleness"] = None
    if mode == "tf":
        options["backend"] = "tensorflow"
    if key.endswith("noprefetch"):
        options["prefetch_weights"] = False
    if key.endswith("store"):
        options["transport"] = "object-store"
    # Half a CPU per server: 2 workers + 2 servers (+ TensorFlow's chief) on num_cpus=4.
    return raytf.ParameterServer(workers=2, ps=servers, cpus_per_ps=0.5, **options)


def run_raytf(layout_name: str, args: argparse.Namespace) -> dict[str, Any]:
    """raytf.fit end to end: placement, actors, strategy, epochs, final weights."""
    import raytf

    layouts = {
        "towers": raytf.InGraph(devices=2, strategy="towers"),
        "mirrored": raytf.InGraph(devices=2, strategy="mirrored"),
        "all-reduce": raytf.AllReduce(workers=2),
    }
    layout = _ps_layout(layout_name) if layout_name.startswith("ps-") else layouts[layout_name]
    t0 = time.time()
    result = raytf.fit(
        model=partial(build_model, args.workload, args.optimizer),
        data=partial(make_data, args.workload, straggler_ms=args.straggler_ms),
        global_batch_size=GLOBAL_BATCH,
        epochs=args.epochs,
        steps_per_epoch=args.steps,
        steps_per_execution=args.spe,
        layout=layout,
        verbose=False,
        seed=MODEL_SEED,
    )
    wall = time.time() - t0
    out = {
        "throughput": result.throughput,
        "first_step_s": result.time_to_first_step_s,
        "wall_s": wall,
        "loss": result.history["loss"][-1],
        "worker_throughput": result.worker_throughput,
        "layout": result.layout.describe(),
    }
    if result.servers:  # parameter servers: where the time went, and how stale it got
        out["details"] = _ps_details(result)
    return out


def _ps_details(result: Any) -> str:
    parts = []
    rates = [w.steps_per_second for w in result.workers]
    if any(rates):
        parts.append("steps/s per worker " + "/".join(f"{r:.0f}" for r in rates if r))
    timing = [w.timing for w in result.workers if w.timing]
    if timing:
        t = timing[0]
        steps = max(1, t["steps"])
        parts.append(
            "worker 0 ms/step: wait {:.1f}, compute {:.1f}, push {:.1f}".format(
                *(1000 * t[k] / steps for k in ("wait_s", "compute_s", "push_s"))
            )
        )
    if result.staleness:
        s = result.staleness
        parts.append(f"staleness p50/p90/max {s['p50']}/{s['p90']}/{s['max']}")
    if result.steps_ahead:
        parts.append(f"steps ahead max {result.steps_ahead['max']}")
    for server in result.servers:
        if server.bytes is not None:
            dropped = f", dropped {server.dropped}" if server.dropped else ""
            parts.append(
                f"{server.name}: {server.bytes / 1e6:.2f} MB, {server.applied} updates "
                f"in {server.apply_seconds:.1f}s{dropped}"
            )
        else:
            parts.append(f"{server.name}: {len(server.holds)} variables")
    return "; ".join(parts)


def _ray_train_loop(config: dict[str, Any]) -> None:
    """Ray Train worker: run raytf's loop under the TF_CONFIG that Ray Train wrote."""
    import ray.train

    from raytf._internal.spec import MULTI_WORKER, StrategySpec
    from raytf._internal.worker.loop import run_in_process

    args = argparse.Namespace(**config["args"])
    rank = ray.train.get_context().get_world_rank()
    world = ray.train.get_context().get_world_size()
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    spec = StrategySpec(
        kind=MULTI_WORKER,
        devices=1,
        worker_index=rank,
        num_workers=world,
        cluster=cluster,
        communication="auto",
    )
    loop, epochs = run_in_process(spec, _job(args))
    out = {
        "rank": rank,
        "throughput": loop.throughput,
        "first_step_at": loop.runner.clock.first_step_at,
        "loss": epochs[-1]["logs"]["loss"],
        "pid": os.getpid(),
    }
    with open(os.path.join(config["out_dir"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)  # a file, not ray.train.report: both ranks' figures are needed


def run_ray_train(args: argparse.Namespace) -> dict[str, Any]:
    """The peer: Ray Train's TensorflowTrainer, 2 workers, raytf's loop in its worker function."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer  # imports TensorFlow: before the timer

    with tempfile.TemporaryDirectory(prefix="raytf-bench-") as tmp:
        out_dir = os.path.join(tmp, "out")
        os.makedirs(out_dir)
        trainer = TensorflowTrainer(
            _ray_train_loop,
            train_loop_config={"args": vars(args), "out_dir": out_dir},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(name="raytf-benchmark", storage_path=os.path.join(tmp, "st")),
        )
        t0 = time.time()
        trainer.fit()
        wall = time.time() - t0
        ranks = []
        for name in sorted(os.listdir(out_dir)):
            with open(os.path.join(out_dir, name)) as f:
                ranks.append(json.load(f))
    if len(ranks) != 2:
        raise RuntimeError(f"expected 2 worker reports, found {len(ranks)}")
    throughputs = [r["throughput"] for r in ranks]
    firsts = [r["first_step_at"] for r in ranks]
    return {
        "throughput": sum(throughputs) if all(throughputs) else None,
        "first_step_s": max(firsts) - t0 if all(firsts) else None,
        "wall_s": wall,
        "loss": ranks[0]["loss"],
        "worker_throughput": throughputs,
    }


def child_main(args: argparse.Namespace) -> None:
    """Run one runner and print its measurements as one JSON line; errors become a JSON field."""
    # SIGTERM from the parent's timeout: raise SystemExit so `finally` shuts Ray down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.getLogger("ray").setLevel(logging.ERROR)
    runner = RUNNER_BY_KEY[args.runner]
    table: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "bare-tf": run_bare_tf,
        "loop-towers": partial(run_loop, "towers"),
        "loop-mirrored": partial(run_loop, "mirrored"),
        "loop-towers-ray": partial(run_loop, "towers"),
        "loop-mirrored-ray": partial(run_loop, "mirrored"),
        "raytf-towers": partial(run_raytf, "towers"),
        "raytf-mirrored": partial(run_raytf, "mirrored"),
        "raytf-allreduce": partial(run_raytf, "all-reduce"),
        "ray-train": run_ray_train,
        **{r.key: partial(run_raytf, r.key) for r in RUNNERS if r.key.startswith("ps-")},
    }
    try:
        import tensorflow  # noqa: F401  (import cost stays outside every timer; no op runs)

        if runner.needs_ray:
            _start_ray(args.num_cpus)
        try:
            out = table[runner.key](args)
        finally:
            if runner.needs_ray:
                import ray

                ray.shutdown()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()
        out = {"error": message[0][:300] if message else type(exc).__name__}
    print(RESULT_MARKER + json.dumps(out), flush=True)


# ------------------------------------------------------------------------------- parent
def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DEDUP_LOGS": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("TF_CONFIG", None)  # a leaked TF_CONFIG changes what MirroredStrategy does
    env.pop("RAY_ADDRESS", None)
    return env


def _short_reason(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln:
            return ln[:200]
    return lines[-1][:200] if lines else "no output"


def run_child(runner: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """One runner in a fresh process group; on timeout the whole group (Ray too) is killed."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        "--runner",
        runner,
        "--workload",
        workload,
        "--steps",
        str(args.steps or DEFAULT_STEPS[workload]),
        "--epochs",
        str(args.epochs),
        "--spe",
        str(args.spe),
        "--optimizer",
        args.optimizer,
        "--num-cpus",
        str(args.num_cpus),
        "--straggler-ms",
        str(args.straggler_ms),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        return {"error": f"timed out after {args.timeout:g}s"}
    if args.verbose and stderr:
        sys.stderr.write(f"--- {workload}/{runner} stderr ---\n{stderr}\n")
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    return {"error": f"exit {proc.returncode}: {_short_reason(stderr)}"}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over the repeats that worked; the first error if none did."""
    ok = [r for r in results if "error" not in r and r.get("throughput")]
    if not ok:
        errors = [r["error"] for r in results if "error" in r]
        return {"error": errors[0] if errors else "no throughput measured"}
    tps = [r["throughput"] for r in ok]
    firsts = [r["first_step_s"] for r in ok if r.get("first_step_s") is not None]
    return {
        "throughput": statistics.median(tps),
        "min": min(tps),
        "max": max(tps),
        "first_step_s": statistics.median(firsts) if firsts else None,
        "wall_s": statistics.median(r["wall_s"] for r in ok),
        "ok": len(ok),
        "runs": len(results),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def build_rows(
    summary: dict[tuple[str, str], dict[str, Any]],
    workloads: list[str],
    runners: list[str],
    repeats: int,
) -> tuple[list[str], list[list[str]]]:
    header = ["workload", "runner", "examples/s", "vs bare-tf", "first step s", "wall s"]
    if repeats > 1:
        header.insert(3, "range (min-max)")
    rows = []
    for w in workloads:
        base = summary.get((w, "bare-tf"), {}).get("throughput")
        for key in runners:
            s = summary[(w, key)]
            label = RUNNER_BY_KEY[key].label
            if "error" in s:
                reason = s["error"] if len(s["error"]) <= 70 else s["error"][:67] + "..."
                row = [w, label, f"failed: {reason}", "-", "-", "-"]
                if repeats > 1:
                    row.insert(3, "-")
                rows.append(row)
                continue
            ratio = s["throughput"] / base if base else None
            tp = f"{s['throughput']:,.0f}"
            if s["ok"] < s["runs"]:
                tp += f" ({s['ok']}/{s['runs']} ok)"
            row = [
                w,
                label,
                tp,
                _fmt(ratio, ".2f") + ("x" if ratio else ""),
                _fmt(s["first_step_s"], ".2f"),
                _fmt(s["wall_s"], ".1f"),
            ]
            if repeats > 1:
                row.insert(3, f"{s['min']:,.0f}-{s['max']:,.0f}")
            rows.append(row)
    return header, rows


def plain_table(header: list[str], rows: list[list[str]]) -> str:
    numeric = {i for i, h in enumerate(header) if h not in ("workload", "runner")}
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            failed = cell.startswith("failed:")
            out.append(
                cell.rjust(widths[i]) if i in numeric and not failed else cell.ljust(widths[i])
            )
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), sep, *(line(r) for r in rows)])


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    align = ["---" if h in ("workload", "runner") else "---:" for h in header]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def pair_notes(
    summary: dict[tuple[str, str], dict[str, Any]], workloads: list[str], runners: list[str]
) -> list[str]:
    notes = []
    for w in workloads:
        for a, b in PAIRS:
            if a in runners and b in runners:
                ta = summary[(w, a)].get("throughput")
                tb = summary[(w, b)].get("throughput")
                if ta and tb:
                    notes.append(
                        f"{w}: {RUNNER_BY_KEY[a].label} / {RUNNER_BY_KEY[b].label}"
                        f" = {ta / tb:.3f} ({(ta / tb - 1) * 100:+.1f}%)"
                    )
    return notes


def machine_facts() -> str:
    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    tf = version("tensorflow-cpu")
    if tf == "not installed":
        tf = version("tensorflow")
    return (
        f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
        f"TensorFlow {tf}, Keras {version('keras')}, Ray {version('ray')}"
    )


def parent_main(args: argparse.Namespace) -> None:
    """Run every (workload, runner) in its own process, repeats interleaved, then print."""
    workloads = list(WORKLOADS) if args.workload == "all" else [args.workload]
    if args.runners == "all":
        runners = [r.key for r in RUNNERS]
    else:
        runners = GROUPS.get(args.runners) or args.runners.split(",")
    unknown = [r for r in runners if r not in RUNNER_BY_KEY]
    if unknown:
        sys.exit(f"unknown runner(s) {unknown}; choose from {[r.key for r in RUNNERS]}")
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    steps = {w: args.steps or DEFAULT_STEPS[w] for w in workloads}
    print(machine_facts())
    print(f"command: {command}")
    print(
        f"settings: global batch {GLOBAL_BATCH}, steps/epoch {steps}, epochs {args.epochs}, "
        f"{args.spe} steps per tf.function call, optimizer {args.optimizer}, "
        f"repeats {args.repeats}, Ray num_cpus {args.num_cpus}"
        + (f", worker 1 slowed by {args.straggler_ms:g} ms/step" if args.straggler_ms else ""),
        flush=True,
    )
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    started = time.time()
    # Repeats are the outer loop so slow drift on a shared machine hits every runner alike.
    for rep in range(args.repeats):
        for w in workloads:
            for key in runners:
                t = time.time()
                res = run_child(key, w, args)
                results.setdefault((w, key), []).append(res)
                status = res.get("error") or f"{res.get('throughput') or 0:,.0f} ex/s"
                print(
                    f"  [{rep + 1}/{args.repeats}] {w:>3} {key:<16} {time.time() - t:5.1f}s"
                    f"  {status}",
                    file=sys.stderr,
                    flush=True,
                )
    summary = {k: summarize(v) for k, v in results.items()}
    header, rows = build_rows(summary, workloads, runners, args.repeats)
    print()
    print(plain_table(header, rows))
    for note in pair_notes(summary, workloads, runners):
        print(note)
    for (w, key), runs in results.items():
        details = [r["details"] for r in runs if r.get("details")]
        if details:
            print(f"  {w} {key}: {details[-1]}")
    print(
        "examples/s: steady state, global, the first (tracing) tf.function call excluded.\n"
        "first step s: from the call (raytf.fit / trainer.fit / start of the by-hand run) to "
        "the first finished step;\n  the driver's TensorFlow import and ray.init are outside "
        "it, actor start-up (and its TensorFlow import) inside."
    )
    print(f"total benchmark time: {time.time() - started:.0f}s")
    if args.markdown:
        print()
        print(markdown_table(header, rows))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps per epoch (default per workload: {DEFAULT_STEPS})",
    )
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per (workload, runner), each in a fresh process; median shown",
    )
    p.add_argument(
        "--spe", type=int, default=50, help="steps per tf.function call (raytf's 'auto' is 50)"
    )
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument(
        "--runners",
        default="core",
        help=f"'core' (default), 'ps', 'all', or a comma-separated subset of "
        f"{[r.key for r in RUNNERS]}",
    )
    p.add_argument(
        "--straggler-ms",
        type=float,
        default=0.0,
        help="slow raytf's worker 1 by this many ms per step (a straggler)",
    )
    p.add_argument("--num-cpus", type=int, default=4, help="ray.init(num_cpus=...) in children")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per child process")
    p.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    p.add_argument("--verbose", action="store_true", help="show every child's stderr")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--runner", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("steps", "epochs", "repeats", "spe", "num_cpus"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.child and (args.runner not in RUNNER_BY_KEY or args.workload == "all"):
        p.error("--child needs --runner and a single --workload")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()

"""``raytf run EXPERIMENT`` trains; ``raytf plan`` says which layout would run, and why."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from raytf.errors import RaytfError, WorkerError

ADDRESS_HELP = (
    "Ray address: 'auto' for a running cluster on this machine, or host:port. Default: "
    "$RAYTF_ADDRESS, else $RAY_ADDRESS, else a private local Ray inside this process"
)


def _nodes(text: str) -> Any:
    """``--nodes 8:4,8:4`` -> a hypothetical cluster of (cpus, gpus) nodes."""
    from raytf._internal.cluster import ClusterInfo

    try:
        pairs = [tuple(float(v) for v in part.split(":")) for part in text.split(",")]
        if any(len(p) != 2 for p in pairs):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CPUS:GPUS per node, comma-separated (e.g. 8:4,8:4), got {text!r}"
        ) from None
    return ClusterInfo.from_counts(*pairs)


def _gpu_flag(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--use-gpu",
        dest="use_gpu",
        action="store_const",
        const=True,
        help="train on GPUs (fail fast if the cluster has none)",
    )
    group.add_argument(
        "--no-gpu",
        dest="use_gpu",
        action="store_const",
        const=False,
        help="train on CPUs even on a GPU cluster",
    )


def _staleness(text: str) -> int | str:
    if text == "async":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 0 (synchronous), a number of steps k, or 'async', received {text!r}"
        ) from None


def _layout_flags(parser: argparse.ArgumentParser) -> None:
    from raytf.layouts import layout_names

    parser.add_argument("--layout", help=f"auto (default) or one of {layout_names()}")
    parser.add_argument("--replicas", type=int, help="total replicas (devices) to train on")
    parser.add_argument("--workers", type=int, help="all-reduce, parameter-server: worker actors")
    parser.add_argument("--ps", type=int, help="parameter-server: server actors")
    parser.add_argument(
        "--staleness",
        type=_staleness,
        help="parameter-server: 0 synchronous (default), k bounded, 'async' unbounded",
    )
    parser.add_argument(
        "--backup-workers",
        type=int,
        help="parameter-server, synchronous: close each step without the b slowest workers",
    )
    parser.add_argument(
        "--devices",
        type=int,
        help="devices per actor (in-graph: all of them; all-reduce: per worker)",
    )
    parser.add_argument(
        "--strategy",
        choices=["auto", "towers", "mirrored"],
        help="in-graph: one tower per device in one graph, or MirroredStrategy",
    )
    parser.add_argument(
        "--backend",
        choices=["auto", "ray", "tensorflow"],
        help="parameter-server: raytf's own (every mode) or TensorFlow's (asynchronous)",
    )
    parser.add_argument(
        "--transport",
        choices=["tcp", "object-store"],
        help="parameter-server, raytf's backend: TCP streams (default) or Ray's object store",
    )
    parser.add_argument(
        "--stragglers",
        action="store_true",
        default=None,
        help="auto: some workers are slower (shared or mixed machines)",
    )
    parser.add_argument(
        "--preemptible",
        action="store_true",
        default=None,
        help="auto: workers may vanish (spot instances)",
    )
    _gpu_flag(parser)
    parser.add_argument("--address", help=ADDRESS_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raytf", description="Distributed TensorFlow on Ray, with the layout chosen for you."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train an experiment file")
    run.add_argument("experiment", help="a .py file (model, data) or a .yaml naming one")
    _layout_flags(run)
    run.add_argument("--epochs", type=int)
    run.add_argument("--batch", dest="global_batch_size", type=int, help="global batch size")
    run.add_argument("--steps-per-epoch", type=int)
    run.add_argument("--checkpoint-dir", help="write checkpoints and model.keras here")
    run.add_argument(
        "--working-dir",
        help="ship this directory to every actor (Ray's runtime_env working_dir), for models "
        "and data functions that import modules of your project",
    )
    run.add_argument(
        "--max-failures",
        type=int,
        help="recover from this many dead or preempted actors (default 0: fail)",
    )
    run.add_argument(
        "--checkpoint-every-steps",
        type=int,
        help="checkpoint every N steps within epochs (bounds the work redone after a failure)",
    )
    run.add_argument(
        "--min-workers",
        type=int,
        help="elastic all-reduce: go on with down to N workers when a lost one cannot be "
        "replaced, and grow back when resources return (needs --max-failures)",
    )
    run.add_argument(
        "--elastic-batch",
        choices=["global", "per_worker"],
        help="elastic: keep the global batch (default) or each worker's batch",
    )
    run.add_argument(
        "--resume",
        action="store_const",
        const=True,
        help="resume from the latest checkpoint in --checkpoint-dir",
    )
    run.add_argument("--seed", type=int)
    run.add_argument("--quiet", action="store_true", help="no per-epoch progress")

    plan = sub.add_parser("plan", help="print the layout raytf would choose, without training")
    plan.add_argument("experiment", nargs="?", help="optional: take layout settings from it")
    _layout_flags(plan)
    plan.add_argument(
        "--nodes",
        type=_nodes,
        help="plan for a hypothetical cluster instead, e.g. --nodes 8:4,8:4 "
        "(CPUS:GPUS per node); needs no Ray",
    )

    swp = sub.add_parser("sweep", help="one Ray Tune trial per configuration of the file's space")
    swp.add_argument("experiment", help="a .py defining `space`, or a .yaml with a space: block")
    swp.add_argument(
        "--metric",
        default="throughput",
        help="throughput (default), a per-epoch log such as val_accuracy, or "
        "time_to_target_s with --target",
    )
    swp.add_argument("--mode", choices=["min", "max"], help="default: from the metric's name")
    swp.add_argument(
        "--target",
        nargs=2,
        metavar=("METRIC", "VALUE"),
        help="for time_to_target_s, e.g. --target val_accuracy 0.95",
    )
    swp.add_argument(
        "--scheduler",
        choices=["asha", "pbt"],
        help="asha: stop hopeless trials early; pbt: Population Based Training",
    )
    swp.add_argument(
        "--search-alg",
        choices=["optuna", "hyperopt", "bayesopt"],
        help="sample the space with this library (installed); set --num-samples",
    )
    swp.add_argument("--num-samples", type=int, default=1)
    swp.add_argument("--storage", help="results directory (default ./raytf-sweeps)")
    swp.add_argument("--name", help="sweep name (default sweep-<time>)")
    swp.add_argument(
        "--resume",
        action="store_true",
        help="go on with an interrupted sweep (--name, or the newest in --storage)",
    )
    swp.add_argument("--epochs", type=int)
    swp.add_argument("--address", help=ADDRESS_HELP)
    swp.add_argument("--quiet", action="store_true", help="no live Tune progress")

    doc = sub.add_parser("doctor", help="check versions, GPUs, the cluster and node-to-node TCP")
    doc.add_argument("--address", help=ADDRESS_HELP)
    doc.add_argument("--timeout", type=float, default=60.0, help="seconds per check")

    sub.add_parser("layouts", help="list the registered layout names")
    return parser


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    keys = (
        "layout",
        "replicas",
        "workers",
        "devices",
        "ps",
        "staleness",
        "backup_workers",
        "strategy",
        "backend",
        "transport",
        "stragglers",
        "preemptible",
        "use_gpu",
        "epochs",
        "global_batch_size",
        "steps_per_epoch",
        "checkpoint_dir",
        "max_failures",
        "checkpoint_every_steps",
        "min_workers",
        "elastic_batch",
        "resume",
        "seed",
    )
    overrides = {k: getattr(args, k, None) for k in keys}
    if getattr(args, "working_dir", None):
        overrides["runtime_env"] = {"working_dir": args.working_dir}
    return overrides


def _cmd_plan(args: argparse.Namespace) -> int:
    import raytf
    from raytf._internal.experiment import Experiment, load_experiment
    from raytf._internal.resolve import LayoutRequest

    if args.experiment:
        experiment = load_experiment(args.experiment)
    else:
        experiment = Experiment(path="<flags>", model=print, data=print)
    config = experiment.with_overrides(_overrides(args)).config
    if args.nodes is not None:
        cluster = args.nodes
    else:
        raytf.api.connect(args.address)
        cluster = raytf.api.current_cluster()
    print(raytf.api.plan_request(LayoutRequest.from_config(config), cluster))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import raytf
    from raytf._internal.experiment import fit_kwargs, load_experiment

    experiment = load_experiment(args.experiment).with_overrides(_overrides(args))
    raytf.api.connect(args.address)
    kwargs = fit_kwargs(experiment, raytf.api.current_cluster())
    raytf.keep_warm(0)  # one run, then this process ends: warm actors would be waste
    result = raytf.fit(verbose=not args.quiet, **kwargs)
    first = result.time_to_first_step_s
    print(
        f"raytf: done: {result.epochs_trained} epoch(s), {result.global_step} steps in "
        f"{result.wall_time_s:.1f}s; first step after {first:.1f}s; "
        f"{result.throughput or 0:,.0f} examples/s "
        f"(per worker: {', '.join(f'{t or 0:,.0f}' for t in result.worker_throughput)})"
    )
    if result.model_path:
        print(f"raytf: model saved to {result.model_path}")
    if experiment.evaluate is None:
        return 0
    scores = dict(experiment.evaluate(result.load_model()))
    print("raytf: evaluation: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
    missed = {
        k: (scores.get(k), want)
        for k, want in experiment.targets.items()
        if scores.get(k) is None or scores[k] < want
    }
    if missed:
        for key, (got, want) in missed.items():
            print(f"raytf: target missed: {key} = {got} (wanted >= {want})", file=sys.stderr)
        return 1
    if experiment.targets:
        print(
            "raytf: targets met: " + ", ".join(f"{k} >= {v}" for k, v in experiment.targets.items())
        )
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    import raytf
    from raytf._internal.experiment import load_experiment

    experiment = load_experiment(args.experiment).with_overrides({"epochs": args.epochs})
    if not experiment.space:
        raise raytf.ConfigError(
            f"{args.experiment} has no search space: define `space = {{...}}` in the .py file "
            "or a `space:` block in the YAML, e.g. space: {layout: {grid_search: [towers, "
            "all-reduce]}}."
        )
    target = None
    if args.target:
        try:
            target = (args.target[0], float(args.target[1]))
        except ValueError:
            raise raytf.ConfigError(
                f"--target takes a metric and a number, received {args.target!r}; e.g. "
                "--target val_accuracy 0.95."
            ) from None
    result = raytf.sweep(
        experiment.model,
        experiment.data,
        space=experiment.space,
        metric=args.metric,
        mode=args.mode,
        target=target,
        validation_data=experiment.validation_data,
        scheduler=args.scheduler,
        search_alg=args.search_alg,
        num_samples=args.num_samples,
        storage_path=args.storage,
        name=args.name,
        resume=args.resume,
        experiment_file=experiment.module_path,
        address=args.address,
        verbose=not args.quiet,
        targets=experiment.targets,
        **experiment.config,
    )
    print(result.table())
    return 0 if result.best_config is not None else 1


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # evaluate() imports TF in the driver
    args = build_parser().parse_args(argv)
    try:
        if args.command == "layouts":
            from raytf.layouts import layout_names

            print("\n".join(["auto", *layout_names()]))
            return 0
        if args.command == "plan":
            return _cmd_plan(args)
        if args.command == "sweep":
            return _cmd_sweep(args)
        if args.command == "doctor":
            from raytf._internal.doctor import run_doctor
            from raytf.api import cluster_address

            return run_doctor(cluster_address(args.address), timeout=args.timeout)
        return _cmd_run(args)
    except WorkerError as exc:
        print(f"raytf: error: {exc}", file=sys.stderr)
        return 1
    except RaytfError as exc:
        print(f"raytf: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

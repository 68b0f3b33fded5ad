"""The driver side of a run: reserve resources, start actors, wire TensorFlow, run epochs.

Every wait has a timeout and a failure anywhere tears down everything this run started.
``WorkerGroup`` is the swap point: tests and future layouts can hand in their own.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    get_current_placement_group,
    placement_group,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raytf._internal.job import Job
from raytf._internal.worker import BIND_FAILURE, TrainWorker
from raytf.callbacks import Callback, RunInfo
from raytf.config import Timeouts
from raytf.errors import (
    ConfigError,
    PlacementError,
    RaytfError,
    StartupTimeoutError,
    WorkerError,
)
from raytf.layouts.base import Layout
from raytf.result import FitResult

BIND_ATTEMPTS = 3


class _PortTaken(Exception):
    """A TensorFlow server lost its port to another process; retry with fresh ports."""


def _unwrap(exc: Exception, name: str) -> Exception:
    """The error a user should see for a failed actor call."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause
        if isinstance(cause, RaytfError):
            return cause
        return WorkerError(
            f"{name} failed: {cause!r}",
            worker=name,
            error_type=type(cause).__name__,
            remote_traceback=str(exc),
        )
    if isinstance(exc, ray.exceptions.RayActorError):
        return WorkerError(
            f"{name} died (its process exited or was killed): {exc}",
            worker=name,
            error_type=type(exc).__name__,
        )
    return exc


class WorkerGroup:
    """The actors of one attempt at running a layout."""

    def __init__(self, layout: Layout, placement: PlacementGroup | None) -> None:
        self.layout = layout
        self.placement = placement
        self.actors: list[Any] = []
        self.names: list[str] = []

    worker_cls: type = TrainWorker

    def _spawn(self, cls: type, index: int, bundle: dict[str, float], *args: Any) -> Any:
        """Start one actor of ``cls`` on bundle ``index`` of the placement group."""
        if self.placement is not None:
            strategy = PlacementGroupSchedulingStrategy(
                self.placement,
                placement_group_bundle_index=index,
                placement_group_capture_child_tasks=True,
            )
        else:  # inside a caller's placement group (a Tune trial): actors land in it
            strategy = None
        return (
            ray.remote(cls)
            .options(
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                max_restarts=0,
                scheduling_strategy=strategy,
            )
            .remote(*args)
        )

    def spawn(self) -> None:
        workers = self.layout.num_workers
        for i, bundle in enumerate(self.layout.bundles()[:workers]):
            name = f"worker-{i}" if workers > 1 else "worker"
            self.actors.append(self._spawn(self.worker_cls, i, bundle, name))
            self.names.append(name)

    def call(
        self, method: str, args: Sequence[tuple] | None, timeout_s: float, phase: str
    ) -> list[Any]:
        """Call ``method`` on every worker; fail fast on the first error, bounded by a timeout."""
        return self.call_on(self.actors, self.names, method, args, timeout_s, phase)

    def call_on(
        self,
        actors: Sequence[Any],
        names: Sequence[str],
        method: str,
        args: Sequence[tuple] | None,
        timeout_s: float,
        phase: str,
    ) -> list[Any]:
        """Call ``method`` on ``actors``: the first error wins; a timeout names the laggards."""
        args = args if args is not None else [()] * len(actors)
        refs = [getattr(a, method).remote(*a_args) for a, a_args in zip(actors, args)]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        deadline = time.monotonic() + timeout_s
        while pending:
            ready, pending = ray.wait(
                pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            if not ready:
                missing = sorted(names[index[r]] for r in pending)
                raise StartupTimeoutError(self._timeout_message(phase, timeout_s, missing))
            try:
                ray.get(ready[0])
            except Exception as exc:
                raise _unwrap(exc, names[index[ready[0]]]) from None
        return ray.get(refs)

    @staticmethod
    def _timeout_message(phase: str, timeout_s: float, missing: list[str]) -> str:
        hints = {
            "start": "actors did not start (a node too slow to import TensorFlow, or a "
            "model/data function that hangs); raise Timeouts(start_s=...)",
            "peers": "TensorFlow peers did not connect: a peer is missing or the nodes cannot "
            "open TCP connections to each other on ephemeral ports (check firewalls "
            "and security groups); raise Timeouts(peers_s=...) for slow networks",
            "epoch": "an epoch did not finish; raise Timeouts(epoch_s=...) for long epochs",
            "final": "the final model was not saved in time; raise Timeouts(start_s=...)",
        }
        return (
            f"{', '.join(missing)} did not finish '{phase}' within {timeout_s:g}s: "
            f"{hints.get(phase, phase)}. Every actor of the run was stopped."
        )

    def shutdown(self) -> None:
        for actor in self.actors:
            # Already gone, or Ray is shutting down: keep killing the rest.
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self.actors = []


def reserve(layout: Layout, timeout_s: float) -> PlacementGroup | None:
    """A placement group for the layout's bundles, or None inside a caller's group."""
    if get_current_placement_group() is not None:
        return None
    bundles = layout.bundles()
    pg = placement_group(bundles, strategy=layout.placement_strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(
            f"Could not reserve {bundles} for {layout.describe()} within {timeout_s:g}s: the "
            "cluster has these resources in total, but they are held by other actors or jobs. "
            "Free them, use fewer replicas, or raise Timeouts(placement_s=...)."
        )
    return pg


class Coordinator:
    """Runs one layout end to end. ``group_cls`` is the swap point for tests.

    Layouts with more than worker actors (parameter servers) subclass it and fill the hooks:
    ``_prepare`` after the model is built, ``_before_epoch``/``_after_epoch`` around each
    epoch, and ``_report`` for what the result adds.
    """

    group_class: type[WorkerGroup] = WorkerGroup

    def __init__(
        self,
        layout: Layout,
        job: Job,
        timeouts: Timeouts,
        explanation: str,
        callbacks: Sequence[Callback] = (),
        group_cls: type[WorkerGroup] | None = None,
        model_dir: str | None = None,
        started: float | None = None,
    ) -> None:
        self.layout = layout
        self.job = job
        self.timeouts = timeouts
        self.explanation = explanation
        self.callbacks = list(callbacks)
        self.group_cls = group_cls or self.group_class
        self.model_dir = model_dir
        self.started = started  # wall clock of the user's call, for time to first step

    def _start(self, placement: PlacementGroup | None) -> tuple[WorkerGroup, list, list]:
        t = self.timeouts
        for attempt in range(1, BIND_ATTEMPTS + 1):
            group = self.group_cls(self.layout, placement)
            try:
                group.spawn()
                ready = group.call("ready", None, t.start_s, "start")
                addresses = None
                if self.layout.needs_addresses:
                    addresses = group.call("reserve_address", None, t.start_s, "start")
                specs = self.layout.strategy_specs(addresses)
                try:
                    devices = self._start_strategies(group, specs)
                except WorkerError as exc:
                    if BIND_FAILURE in str(exc) and attempt < BIND_ATTEMPTS:
                        raise _PortTaken() from exc
                    raise
                return group, ready, devices
            except _PortTaken:
                group.shutdown()
            except BaseException:
                group.shutdown()
                raise
        raise AssertionError("unreachable")  # the last attempt re-raises

    def run(self) -> FitResult:
        started = self.started or time.time()
        job, t = self.job, self.timeouts
        placement = reserve(self.layout, t.placement_s)
        group = None
        try:
            group, ready, devices = self._start(placement)
            infos = group.call("build", [(job,)] * len(group.actors), t.start_s, "start")
            steps = job.steps_per_epoch or min(i["train_steps"] for i in infos)
            val_steps = None
            if job.validation_fn is not None:
                val_steps = job.validation_steps or min(i["validation_steps"] for i in infos)
            start_epoch = self._prepare(group, infos)
            workers = tuple({**r, **d} for r, d in zip(ready, devices))
            run_info = RunInfo(
                self.layout,
                self.explanation,
                job.epochs,
                start_epoch,
                steps,
                val_steps,
                job.global_batch_size,
                workers,
            )
            for cb in self.callbacks:
                cb.on_fit_start(run_info)

            history: dict[str, list[float]] = {}
            checkpoint = None
            global_step = 0
            durations: list[float] = []
            for epoch in range(start_epoch, job.epochs):
                t0 = time.perf_counter()
                self._before_epoch(group, epoch, steps)
                results = group.call(
                    "run_epoch",
                    [(epoch, steps, val_steps)] * len(workers),
                    t.epoch_limit(durations),
                    "epoch",
                )
                seconds = time.perf_counter() - t0
                durations.append(seconds)
                logs = _mean_logs([r["logs"] for r in results])
                logs["examples_per_second"] = steps * job.global_batch_size / seconds
                rates = [r["throughput"] for r in results]
                if all(rates):  # steady state so far, tracing excluded: what sweeps rank on
                    logs["throughput"] = sum(rates)
                for key, value in logs.items():
                    history.setdefault(key, []).append(value)
                global_step = results[0]["global_step"]
                for cb in self.callbacks:
                    cb.on_epoch_end(epoch, logs)
                saved = self._after_epoch(group, epoch, results)
                if saved:
                    checkpoint = saved
                    for cb in self.callbacks:
                        cb.on_checkpoint(epoch, checkpoint)

            finals = group.call(
                "final", [(i == 0,) for i in range(len(workers))], t.start_s, "final"
            )
            extra = self._report(group)
            global_step = extra.pop("global_step", global_step)
        finally:
            if group is not None:
                group.shutdown()
            if placement is not None:
                remove_placement_group(placement)

        chief = finals[0]
        model_path = self._write_model(chief.get("model_bytes"))
        throughputs = [f["throughput"] for f in finals]
        firsts = [f["first_step_at"] for f in finals if f["first_step_at"]]
        keep = ("fingerprint", "throughput", "model_save_error", "steps_per_second", "timing")
        worker_rows = [{**w, **{k: f[k] for k in keep if k in f}} for w, f in zip(workers, finals)]
        result = FitResult(
            layout=self.layout,
            explanation=self.explanation,
            history=history,
            throughput=sum(throughputs) if all(throughputs) else None,
            worker_throughput=throughputs,
            time_to_first_step_s=(max(firsts) - started) if firsts else None,
            wall_time_s=time.time() - started,
            epochs_trained=job.epochs - start_epoch,
            global_step=global_step,
            weights=chief["weights"],
            model_path=model_path,
            checkpoint=checkpoint,
            workers=worker_rows,
            **extra,
        )
        for cb in self.callbacks:
            cb.on_fit_end(result)
        return result

    # ------------------------------------------------------------------ hooks
    def _start_strategies(self, group: WorkerGroup, specs: list[Any]) -> list[Any]:
        """Hand each actor its spec; multi-worker strategies wait here for their peers."""
        return group.call("start_strategy", [(s,) for s in specs], self.timeouts.peers_s, "peers")

    def _prepare(self, group: WorkerGroup, infos: list[dict[str, Any]]) -> int:
        """After every worker built its model: the epoch to start from."""
        return _agreed_start(infos, self.job)

    def _before_epoch(self, group: WorkerGroup, epoch: int, steps: int) -> None:
        """Before the workers start ``epoch``."""

    def _after_epoch(
        self, group: WorkerGroup, epoch: int, results: list[dict[str, Any]]
    ) -> str | None:
        """After every worker finished ``epoch``: the checkpoint written, if any."""
        return results[0]["checkpoint"]

    def _report(self, group: WorkerGroup) -> dict[str, Any]:
        """Extra FitResult fields, read before the actors stop."""
        return {}

    def _write_model(self, model_bytes: bytes | None) -> str | None:
        if model_bytes is None:
            return None
        directory = self.model_dir or tempfile.mkdtemp(prefix="raytf-model-")
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "model.keras")
        with open(path, "wb") as f:
            f.write(model_bytes)
        return path


def _agreed_start(infos: list[dict[str, Any]], job: Job) -> int:
    starts = sorted({i["start_epoch"] for i in infos})
    if len(starts) > 1:
        raise ConfigError(
            f"Workers found different checkpoints to resume from (epochs {starts}) in "
            f"{job.checkpoint_dir!r}: checkpoint_dir must be storage every node can read "
            "(NFS, a mounted bucket), or the replicas would diverge."
        )
    if starts[0] >= job.epochs:
        raise ConfigError(
            f"The checkpoint in {job.checkpoint_dir!r} is at epoch {starts[0]}, and epochs="
            f"{job.epochs}: nothing is left to train. Pass a larger epochs= to continue."
        )
    return starts[0]


def _mean_logs(per_worker: list[dict[str, float]]) -> dict[str, float]:
    """The global value of each log.

    Under all-reduce the metric variables are read collectively, so every worker already
    reports the global value and the mean changes nothing; it is kept for layouts whose
    workers report their own share (equal shares, so the plain mean is the global one).
    """
    keys = per_worker[0].keys()
    return {k: sum(w[k] for w in per_worker) / len(per_worker) for k in keys}

"""The driver side of a run: reserve resources, start actors, wire TensorFlow, run epochs.

Every wait has a timeout and a failure anywhere tears down everything this run started.
``WorkerGroup`` is the swap point: tests and future layouts can hand in their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
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
from raytf.config import FailurePolicy, Timeouts
from raytf.errors import (
    ConfigError,
    PlacementError,
    Preempted,
    RaytfError,
    StartupTimeoutError,
    WorkerError,
)
from raytf.layouts.base import Layout
from raytf.result import FitResult

BIND_ATTEMPTS = 3
#: How long to look for a dead peer behind a surviving peer's error before reporting it.
DEATH_GRACE_S = 2.0


class _PortTaken(Exception):
    """A TensorFlow server lost its port to another process; retry with fresh ports."""


class _Grow(Exception):
    """An elastic run that shrank can have its full size again: checkpointed, restart."""


#: How long an elastic run waits for a smaller reservation, or a probe for returned
#: resources, once it has waited ``replace_within_s`` for the full size.
RESIZE_PROBE_S = 5.0
#: A probe for returned resources waits this long, and after a failed one the run does not
#: probe again for GROW_BACKOFF_S (free resources split over nodes fit no bundle).
GROW_PROBE_S = 1.0
GROW_BACKOFF_S = 60.0


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

    def replace(self, index: int) -> Any:
        """A new actor for worker ``index`` on its bundle (the old one is dead or killed)."""
        with contextlib.suppress(Exception):
            ray.kill(self.actors[index], no_restart=True)
        bundle = self.layout.bundles()[index]
        self.actors[index] = self._spawn(self.worker_cls, index, bundle, self.names[index])
        return self.actors[index]

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
                error = _unwrap(exc, names[index[ready[0]]])
                if pending and not _recoverable(error):
                    # A surviving peer can report first; if another actor died, that death is
                    # the cause (and recoverable): give its error a moment to arrive.
                    done, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_GRACE_S)
                    for ref in done:
                        try:
                            ray.get(ref)
                        except ray.exceptions.RayActorError as death:
                            raise _unwrap(death, names[index[ref]]) from None
                        except Exception:
                            continue
                raise error from None
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
            "checkpoint": "a checkpoint was not written in time (slow storage?); raise "
            "Timeouts(start_s=...)",
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
    #: Split epochs into segments with a checkpoint after each (FailurePolicy intervals).
    #: Off for TensorFlow's parameter-server engine, which schedules whole epochs.
    mid_epoch_checkpoints: bool = True

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
        failures: FailurePolicy | None = None,
    ) -> None:
        self.layout = layout
        self.job = job
        self.timeouts = timeouts
        self.explanation = explanation
        self.callbacks = list(callbacks)
        self.group_cls = group_cls or self.group_class
        self.model_dir = model_dir
        self.started = started  # wall clock of the user's call, for time to first step
        self.failure_policy = failures or FailurePolicy()
        self.server_rows: list[dict[str, Any]] = []  # layouts with server actors fill it
        self.full_layout = layout  # an elastic run's size to grow back to

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
        """Reserve, then run attempts until one finishes; recover from failures the policy
        allows (a dead actor, a preempted worker) by restarting from the newest checkpoint."""
        started = self.started or time.time()
        policy, job = self.failure_policy, self.job
        scratch = None
        if policy.max_failures and not job.checkpoint_dir:
            scratch = tempfile.mkdtemp(prefix="raytf-recovery-")
            job = dataclasses.replace(job, checkpoint_dir=scratch)
        self._run = _RunState(started=started, checkpoint_at=(0, started))
        placement = reserve(self.layout, self.timeouts.placement_s)
        if policy.elastic and placement is None:
            raise ConfigError(
                "An elastic FailurePolicy (min_workers=...) reserves and resizes its own "
                "resources, which it cannot do inside a caller's placement group (a Tune "
                "trial). Drop min_workers for sweeps."
            )
        try:
            while True:
                try:
                    finals, workers, extra = self._attempt(placement, job)
                    break
                except _Grow:
                    old, placement = placement, None  # released by _resize
                    placement = self._resize(old, "resources returned")
                    job = self._job_for_size(job, resume=True)
                except RaytfError as exc:
                    if not _recoverable(exc) or len(self._run.failures) >= policy.max_failures:
                        raise
                    self._failed(exc)
                    if policy.elastic:
                        old, placement = placement, None
                        placement = self._resize(old, "replacements unavailable")
                    # Resume from this run's checkpoints (or the user's, when resuming).
                    resume = self.job.resume or self._run.checkpoint is not None
                    job = self._job_for_size(job, resume=resume)
        finally:
            if placement is not None:
                remove_placement_group(placement)
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return self._result(finals, workers, extra)

    def _attempt(self, placement: PlacementGroup | None, job: Job) -> tuple[list, tuple, dict]:
        """One group of actors, from start-up (or restore) to the final model."""
        t, run = self.timeouts, self._run
        self._job = job  # this attempt's job (a recovery resumes; a scratch checkpoint dir)
        group = None
        try:
            group, ready, devices = self._start(placement)
            infos = group.call("build", [(job,)] * len(group.actors), t.start_s, "start")
            steps = job.steps_per_epoch or min(i["train_steps"] for i in infos)
            run.steps = steps
            val_steps = None
            if job.validation_fn is not None:
                val_steps = job.validation_steps or min(i["validation_steps"] for i in infos)
            start_epoch = self._prepare(group, infos)
            start_step = infos[0].get("start_step", 0) if start_epoch < job.epochs else 0
            # Elastic per-worker batch: steps per epoch changed; the same share of the epoch.
            prior = run.steps_of.get(infos[0].get("restored") or "", steps)
            if prior != steps:
                start_step = start_step * steps // prior
            if start_epoch < job.epochs:
                steps_at = {i.get("start_step", 0) for i in infos}
                if len(steps_at) > 1:
                    raise ConfigError(
                        f"Workers restored different steps {sorted(steps_at)} from "
                        f"{job.checkpoint_dir!r}: checkpoint_dir must be storage every node "
                        "can read (NFS, a mounted bucket)."
                    )
            position = start_epoch * steps + start_step
            self._start_position = position  # where every worker's data started
            if position:  # the data goes on where the checkpoint left it
                group.call("seek", [(position,)] * len(group.actors), t.start_s, "start")
            workers = tuple({**r, **d} for r, d in zip(ready, devices))
            if run.failures and "recovery_s" not in run.failures[-1]:
                self._recovered(infos[0], position, steps, workers)
            if not run.announced:
                run.announced = True
                run.start_epoch = start_epoch
                run_info = RunInfo(
                    self.layout,
                    self.explanation,
                    job.epochs,
                    start_epoch,
                    steps,
                    val_steps,
                    job.global_batch_size,
                    workers,
                    infos[0].get("restored"),
                    tuple(infos[0].get("skipped_checkpoints", ())),
                    tuple(self.server_rows),
                )
                run.resumed_from = infos[0].get("restored") if self.job.resume else None
                for cb in self.callbacks:
                    cb.on_fit_start(run_info)
            run.checkpoint_at = (position, time.time())
            for epoch in range(start_epoch, job.epochs):
                first = start_step if epoch == start_epoch else 0
                results = self._epoch(group, job, epoch, steps, val_steps, first)
                if results is not None:
                    self._finish_epoch(group, job, epoch, steps, results)
            finals = group.call(
                "final", [(i == 0,) for i in range(len(workers))], t.start_s, "final"
            )
            extra = self._report(group)
            return finals, workers, extra
        finally:
            if group is not None:
                group.shutdown()

    def _epoch(
        self, group: WorkerGroup, job: Job, epoch: int, steps: int, val_steps: Any, first: int
    ) -> list[dict[str, Any]] | None:
        """Run an epoch's steps from ``first``, in segments with a checkpoint after each."""
        run, t = self._run, self.timeouts
        self._before_epoch(group, epoch, steps)
        step = first
        results = None
        while step < steps:
            stop = min(steps, step + self._segment(steps))
            run.segment = (epoch, step, stop, steps)
            t0 = time.perf_counter()
            results = self._train(
                group, (epoch, steps, val_steps, step, stop), t.epoch_limit(run.durations)
            )
            seconds = time.perf_counter() - t0
            run.segment = None  # done: a failure from here on is not this segment's
            run.position = epoch * steps + stop
            run.seconds[epoch] = run.seconds.get(epoch, 0.0) + seconds
            run.steps_trained += stop - step
            run.rate = (stop - step) / seconds if seconds else run.rate
            if stop < steps and job.checkpoint_dir:
                path = self._save_segment(group, epoch, stop)
                run.checkpoint_at = (epoch * steps + stop, time.time())
                if path:
                    run.checkpoint = path
                    run.steps_of[path] = steps
                if self._can_grow():  # just checkpointed: restart at the full size
                    raise _Grow()
            step = stop
        return results

    def _finish_epoch(
        self, group: WorkerGroup, job: Job, epoch: int, steps: int, results: list[dict]
    ) -> None:
        run = self._run
        seconds = run.seconds.pop(epoch, 0.0)
        run.durations.append(seconds)
        logs = _mean_logs([r["logs"] for r in results], [r.get("steps") for r in results])
        if seconds:
            logs["examples_per_second"] = steps * job.global_batch_size / seconds
        rates = [r["throughput"] for r in results]
        if all(rates):  # steady state so far, tracing excluded: what sweeps rank on
            logs["throughput"] = sum(rates)
        for key, value in logs.items():
            run.history.setdefault(key, []).append(value)
        run.global_step = results[0]["global_step"]
        # Checkpoint first: a callback that fails or kills must not cost the epoch.
        saved = self._after_epoch(group, epoch, results)
        if saved:
            run.checkpoint = saved
            run.checkpoint_at = ((epoch + 1) * steps, time.time())
            run.steps_of[saved] = steps
        for cb in self.callbacks:
            cb.on_epoch_end(epoch, logs)
        if saved:
            for cb in self.callbacks:
                cb.on_checkpoint(epoch, saved)
        if epoch + 1 < job.epochs and job.checkpoint_dir and self._can_grow():
            if not saved:  # the next epoch's start, so the full group goes on from here
                self._save_segment(group, epoch + 1, 0)
            raise _Grow()

    def _segment(self, steps: int) -> int:
        """Steps between mid-epoch checkpoints: the policy's count, or its seconds at the
        measured step rate; a whole epoch when the policy asks for neither."""
        policy = self.failure_policy
        if not self.mid_epoch_checkpoints:
            return steps
        if policy.checkpoint_every_steps:
            return min(steps, policy.checkpoint_every_steps)
        if policy.checkpoint_every_s:
            if self._run.rate:
                return max(1, min(steps, int(self._run.rate * policy.checkpoint_every_s)))
            return max(1, steps // 10)  # until a rate is measured
        return steps

    # ------------------------------------------------------------------ elastic
    def _resize(self, placement: PlacementGroup | None, reason: str) -> PlacementGroup:
        """A new reservation for an elastic run: the full size if it can be had within
        ``replace_within_s``, else the largest size down to ``min_workers`` that fits."""
        policy, full, old = self.failure_policy, self.full_layout, self.layout
        if placement is not None:
            remove_placement_group(placement)
        t0 = time.time()
        sizes = [n for n in range(full.num_workers, policy.min_workers - 1, -1) if self._fits(n)]
        for i, n in enumerate(sizes):
            layout = full.resized(n)
            try:
                pg = reserve(layout, policy.replace_within_s if i == 0 else RESIZE_PROBE_S)
            except PlacementError:
                continue
            self.layout = layout
            if n != old.num_workers:
                record = {
                    "from_workers": old.num_workers,
                    "to_workers": n,
                    "reason": reason,
                    "position": self._run.position,
                    "global_batch_size": self._batch_for(n),
                    "reserve_s": time.time() - t0,
                }
                self._run.resizes.append(record)
                try:
                    for cb in self.callbacks:
                        cb.on_resize(record)
                except BaseException:
                    remove_placement_group(pg)  # the caller never receives it
                    raise
            return pg
        raise PlacementError(
            f"Could not reserve even min_workers={policy.min_workers} worker(s) of "
            f"{full.describe()} (tried {sizes} worker(s); the full size for "
            f"{policy.replace_within_s:g}s, then {RESIZE_PROBE_S:g}s each): the cluster lost "
            "the resources. Add nodes, or lower min_workers."
        )

    def _fits(self, workers: int) -> bool:
        """Whether ``workers`` workers split the global batch exactly (elastic "global")."""
        if self.failure_policy.elastic_batch != "global":
            return True
        return self.job.global_batch_size % (workers * self.full_layout.devices_per_worker) == 0

    def _batch_for(self, workers: int) -> int:
        if self.failure_policy.elastic_batch == "global":
            return self.job.global_batch_size
        return self.job.global_batch_size * workers // self.full_layout.num_workers

    def _job_for_size(self, job: Job, resume: bool) -> Job:
        batch = self._batch_for(self.layout.num_workers)
        return dataclasses.replace(job, resume=resume, global_batch_size=batch)

    def _can_grow(self) -> bool:
        """A shrunk elastic run: are the missing workers' resources free again? A cheap
        look at the cluster's free resources, then a probe reservation of just them."""
        full, now = self.full_layout, self.layout
        if not self.failure_policy.elastic or now.num_workers >= full.num_workers:
            return False
        if time.monotonic() - self._run.probe_failed_at < GROW_BACKOFF_S:
            return False  # free resources split over nodes would stall every boundary
        missing = full.bundles()[now.num_workers :]
        free = ray.available_resources()
        need: Counter[str] = Counter()
        for bundle in missing:
            need.update(bundle)
        if any(free.get(k, 0.0) < v for k, v in need.items()):
            return False
        probe = placement_group(missing, strategy=full.placement_strategy)
        try:
            ready, _ = ray.wait([probe.ready()], timeout=GROW_PROBE_S)
        finally:
            remove_placement_group(probe)
        if not ready:
            self._run.probe_failed_at = time.monotonic()
        return bool(ready)

    @contextlib.contextmanager
    def _replacing(self, error: RaytfError) -> Iterator[dict[str, Any]]:
        """Record ``error``, then replace its actor in place inside the ``with``. If that
        fails, the record goes and ``error`` ends the attempt: a group restart, recorded so."""
        self._failed(error)
        try:
            yield self._run.failures[-1]
        except Exception:
            self._run.failures.pop()
            raise error from None

    def _replaced(
        self, record: dict[str, Any], row: dict[str, Any], redone: int, batch: int | None
    ) -> None:
        """Complete the record of an actor replaced while the rest of the group ran on."""
        record.update(
            action="replaced in place",
            replacement={k: row[k] for k in ("pid", "node_ip", "node_id")},
            partial=0,  # the segment goes on and counts its steps when it ends
            steps_redone=redone,
            resumed_batch=batch,
        )
        record["recovery_s"] = time.time() - record["detected_at"]
        # The others kept training meanwhile (or waited at a barrier): at most this.
        record["time_lost_s"] = record["recovery_s"]
        for cb in self.callbacks:
            cb.on_recovery(record)

    def _failed(self, exc: RaytfError) -> None:
        """Record a failure the policy tolerates; the next attempt restores a checkpoint."""
        run = self._run
        if run.segment is not None:
            epoch, step, stop, steps = run.segment
            reached, partial = epoch * steps + stop, stop - step
        else:  # between segments (a checkpoint, validation, start-up): no training lost
            epoch, step = divmod(run.position, run.steps or 1)
            stop, reached, partial = step, run.position, 0
        preempted = isinstance(exc, Preempted)
        record = {
            "failure": len(run.failures) + 1,
            "steps_per_epoch": run.steps,
            "worker": getattr(exc, "worker", None),
            "reason": "preempted" if preempted else "died",
            "error": str(exc).splitlines()[0][:300],
            "epoch": epoch,
            "segment": (step, stop),
            "detected_at": time.time(),
            # Work since the last checkpoint: at most the failed segment's end (a death
            # mid-segment); a preempted worker checkpointed where it stopped.
            "reached": reached,
            "partial": partial,  # steps of the failed segment, at most, done before it
            "checkpoint": getattr(exc, "checkpoint", None),
            "stopped_at": getattr(exc, "position", None),  # a preempted run's checkpoint
            "since_checkpoint_s": time.time() - run.checkpoint_at[1],
        }
        run.failures.append(record)
        for cb in self.callbacks:
            cb.on_failure(record)

    def _recovered(
        self, info: dict[str, Any], position: int, steps: int, workers: tuple = ()
    ) -> None:
        record = self._run.failures[-1]
        record["restarted_on"] = [
            {k: w[k] for k in ("name", "pid", "node_ip") if k in w} for w in workers
        ]
        if record["reason"] == "preempted" and record["stopped_at"] == position:
            # It checkpointed where it stopped and that is what came back: nothing redone.
            record["partial"] = max(0, position - (record["reached"] - record["partial"]))
            record["reached"] = position
            record["since_checkpoint_s"] = 0.0
        record["action"] = "restarted the group"
        if record["steps_per_epoch"] and record["steps_per_epoch"] != steps:  # resized
            e, st = divmod(record["reached"], record["steps_per_epoch"])
            record["reached"] = e * steps + st * steps // record["steps_per_epoch"]
        record["restored_checkpoint"] = info.get("restored")
        record["skipped_checkpoints"] = info.get("skipped_checkpoints", [])
        record["restored_epoch"], record["restored_step"] = divmod(position, steps)
        # Epochs after the restored one are trained again: their history entries go.
        keep = max(0, record["restored_epoch"] - self._run.start_epoch)
        for key in self._run.history:
            del self._run.history[key][keep:]
        record["steps_redone"] = max(0, record["reached"] - position)
        record["recovery_s"] = time.time() - record["detected_at"]
        record["time_lost_s"] = record["since_checkpoint_s"] + record["recovery_s"]
        for cb in self.callbacks:
            cb.on_recovery(record)

    def _result(self, finals: list, workers: tuple, extra: dict[str, Any]) -> FitResult:
        run, job = self._run, self.job
        global_step = extra.pop("global_step", run.global_step)
        chief = finals[0]
        model_path = self._write_model(chief.get("model_bytes"))
        throughputs = [f["throughput"] for f in finals]
        firsts = [f["first_step_at"] for f in finals if f["first_step_at"]]
        keep = (
            "fingerprint",
            "throughput",
            "model_save_error",
            "steps_per_second",
            "timing",
            "pid",
        )
        worker_rows = [{**w, **{k: f[k] for k in keep if k in f}} for w, f in zip(workers, finals)]
        failures = [dict(f) for f in run.failures]
        result = FitResult(
            layout=self.layout,
            explanation=self.explanation,
            history=run.history,
            throughput=sum(throughputs) if all(throughputs) else None,
            worker_throughput=throughputs,
            time_to_first_step_s=(max(firsts) - run.started) if firsts else None,
            wall_time_s=time.time() - run.started,
            epochs_trained=job.epochs - run.start_epoch,
            global_step=global_step,
            weights=chief["weights"],
            model_path=model_path,
            checkpoint=None if job.checkpoint_dir is None else run.checkpoint,
            workers=worker_rows,
            failures=failures,
            steps_trained=run.steps_trained + sum(f.get("partial", 0) for f in failures),
            steps_redone=sum(f.get("steps_redone", 0) for f in failures),
            time_lost_s=sum(f.get("time_lost_s", 0.0) for f in failures),
            resumed_from=run.resumed_from,
            resizes=[dict(r) for r in run.resizes],
            **extra,
        )
        for cb in self.callbacks:
            cb.on_fit_end(result)
        return result

    # ------------------------------------------------------------------ hooks
    def _start_strategies(self, group: WorkerGroup, specs: list[Any]) -> list[Any]:
        """Hand each actor its spec; multi-worker strategies wait here for their peers."""
        return group.call("start_strategy", [(s,) for s in specs], self.timeouts.peers_s, "peers")

    def _train(self, group: WorkerGroup, args: tuple, timeout_s: float) -> list[dict[str, Any]]:
        """One segment of training on every worker; any failure ends the attempt."""
        return group.call("run_epoch", [args] * len(group.actors), timeout_s, "epoch")

    def _prepare(self, group: WorkerGroup, infos: list[dict[str, Any]]) -> int:
        """After every worker built its model: the epoch to start from."""
        return _agreed_start(infos, self._job, recovering=bool(self._run.failures))

    def _save_segment(self, group: WorkerGroup, epoch: int, step: int) -> str | None:
        """A mid-epoch checkpoint at ``step`` of ``epoch``: its path (the chief's)."""
        args = [(epoch, step)] * len(group.actors)
        return group.call("save", args, self.timeouts.start_s, "checkpoint")[0]

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


#: Errors that mean an actor or its process went away, not a bug in user code: recoverable.
_LOST = frozenset(
    {
        "RayActorError",
        "ActorDiedError",
        "ActorUnavailableError",
        "WorkerCrashedError",
        "NodeDiedError",
        "OwnerDiedError",
        "LocalRayletDiedError",
        # What a surviving TensorFlow peer reports when the other side vanished.
        "UnavailableError",
        "AbortedError",
        "CancelledError",
    }
)


def _recoverable(exc: Exception) -> bool:
    if isinstance(exc, Preempted):
        return True
    return isinstance(exc, WorkerError) and exc.error_type in _LOST


@dataclasses.dataclass
class _RunState:
    """What a run carries from one attempt to the next."""

    started: float
    history: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    durations: list[float] = dataclasses.field(default_factory=list)
    seconds: dict[int, float] = dataclasses.field(default_factory=dict)
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    resizes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: Steps per epoch of each checkpoint this run wrote (elastic runs change it).
    steps_of: dict[str, int] = dataclasses.field(default_factory=dict)
    #: When the last probe for an elastic run's missing resources failed.
    probe_failed_at: float = float("-inf")
    checkpoint: str | None = None
    checkpoint_at: tuple[int, float] = (0, 0.0)
    position: int = 0
    steps: int = 0  # per epoch
    segment: tuple[int, int, int, int] | None = None
    global_step: int = 0
    steps_trained: int = 0
    start_epoch: int = 0
    rate: float | None = None
    announced: bool = False
    resumed_from: str | None = None


def _agreed_start(infos: list[dict[str, Any]], job: Job, recovering: bool = False) -> int:
    starts = sorted({i["start_epoch"] for i in infos})
    if len(starts) > 1:
        raise ConfigError(
            f"Workers found different checkpoints to resume from (epochs {starts}) in "
            f"{job.checkpoint_dir!r}: checkpoint_dir must be storage every node can read "
            "(NFS, a mounted bucket), or the replicas would diverge."
        )
    if starts[0] >= job.epochs and not recovering:  # a recovery may only need `final`
        raise ConfigError(
            f"The checkpoint in {job.checkpoint_dir!r} is at epoch {starts[0]}, and epochs="
            f"{job.epochs}: nothing is left to train. Pass a larger epochs= to continue."
        )
    return starts[0]


def _mean_logs(
    per_worker: list[dict[str, float]], steps: Sequence[int | None] = ()
) -> dict[str, float]:
    """The global value of each log.

    Under all-reduce the metric variables are read collectively, so every worker already
    reports the global value and the mean changes nothing; it is kept for layouts whose
    workers report their own share. Workers that say how many steps they trained (parameter
    servers: asynchronous shares differ, a replacement may join late or do none) weigh their
    training logs by them; validation logs cover the same data on each and weigh equally.
    """
    keys = per_worker[0].keys()
    plain = [1.0] * len(per_worker)
    weights = plain
    if steps and all(n is not None for n in steps) and sum(steps):  # type: ignore[arg-type]
        weights = [float(n) for n in steps]  # type: ignore[arg-type]
    out = {}
    for k in keys:
        w = plain if k.startswith("val_") else weights
        out[k] = sum(x[k] * wi for x, wi in zip(per_worker, w)) / sum(w)
    return out

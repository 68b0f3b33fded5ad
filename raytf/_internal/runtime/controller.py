"""raytf's one controller: every layout's run, as explicit states stepped one at a time.

START  reserve (once), spawn the backend's actors, wire TensorFlow, build, restore -> TRAIN
TRAIN  one segment (the steps between the failure policy's checkpoints); an epoch's end
       merges logs and checkpoints; -> TRAIN, RESIZE (an elastic run can grow), or DONE
RECOVER  a failure the policy tolerates: stop the group -> START (same size) or RESIZE
RESIZE  an elastic run reserves the largest size it can have -> START

Any other error stops every actor and reaches the caller. ``group_cls`` and ``placer`` are
the swap points that let a unit test step the machine with fake actors and resources.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

from raytf._internal.job import Job
from raytf._internal.runtime import recovery, schedule
from raytf._internal.runtime.backend import Backend, Built
from raytf._internal.runtime.elastic import RESIZE_PROBE_S, Sizing
from raytf._internal.runtime.group import ActorGroup, recoverable
from raytf._internal.runtime.placement import Placer, RayPlacer
from raytf._internal.runtime.report import RunState, announce, fit_result, trim_history
from raytf._internal.worker import keras_callbacks
from raytf.callbacks import Callback
from raytf.config import FailurePolicy, Timeouts
from raytf.errors import ConfigError, PlacementError, RaytfError, WorkerError
from raytf.layouts.base import Layout
from raytf.records import ResizeRecord
from raytf.result import FitResult

#: A TensorFlow server that lost its port to another process says this; start-up retries.
BIND_FAILURE = "Could not start gRPC server"
BIND_ATTEMPTS = 3


class State(enum.Enum):
    START = "start"
    TRAIN = "train"
    RECOVER = "recover"
    RESIZE = "resize"
    DONE = "done"


@dataclasses.dataclass
class Attempt:
    """One group of actors, from start-up to its end (finished, failed or resized)."""

    backend: Backend
    group: ActorGroup
    job: Job
    built: Built
    epoch: int  # the epoch under way
    step: int  # its next step


class Controller:
    """Runs one layout end to end through its backend; see the module docstring."""

    def __init__(
        self,
        layout: Layout,
        job: Job,
        timeouts: Timeouts,
        explanation: str,
        callbacks: Sequence[Callback] = (),
        *,
        failures: FailurePolicy | None = None,
        model_dir: str | None = None,
        started: float | None = None,
        group_cls: type[ActorGroup] = ActorGroup,
        placer: Placer | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        self.layout = self.full_layout = layout
        self.job = job
        self.timeouts = timeouts
        self.explanation = explanation
        self.callbacks = list(callbacks)
        self.policy = failures or FailurePolicy()
        self.model_dir = model_dir
        self.group_cls = group_cls
        self.placer = placer or RayPlacer()
        self.runtime_env = runtime_env  # for every actor: working_dir, py_modules, pip, ...
        started = started or time.time()
        self.run_state = RunState(started=started, checkpoint_at=(0, started))
        self.sizing = Sizing(
            self.policy, layout.num_workers, layout.devices_per_worker, job.global_batch_size
        )
        self.state = State.START
        self.placement: Any = None
        self.reserved = False
        self.attempt: Attempt | None = None
        self.next_job = job  # what the next START builds (resumes after a failure)
        self.resize_reason = ""
        self.scratch: str | None = None
        self.result: FitResult | None = None
        self.spares_on: ActorGroup | None = None  # the group whose spares wait (pool.py)

    # ------------------------------------------------------------------ loop
    def run(self) -> FitResult:
        try:
            while self.state is not State.DONE:
                self.step()
        finally:
            self.close()
        assert self.result is not None  # DONE is only reached with a result
        for cb in self.callbacks:  # after every actor stopped and every resource went back
            cb.on_fit_end(self.result)
        return self.result

    def close(self) -> None:
        """Stop every actor and release what the run reserved (idempotent)."""
        self._stop_group()
        self._drop_spares()
        self.placer.release(self.placement)
        self.placement = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def step(self) -> State:
        """Run the current state once; returns (and moves to) the next."""
        handler = {
            State.START: self._start,
            State.TRAIN: self._train,
            State.RECOVER: self._recover,
            State.RESIZE: self._resize,
        }[self.state]
        try:
            self.state = handler()
        except RaytfError as exc:
            run = self.run_state
            if not recoverable(exc) or len(run.failures) >= self.policy.max_failures:
                raise
            self._record_failure(exc)
            self.state = State.RECOVER
        return self.state

    # ------------------------------------------------------------------ states
    def _start(self) -> State:
        if not self.reserved:
            if self.policy.max_failures and not self.job.checkpoint_dir:
                # Recovery needs checkpoints: a temporary directory on this machine.
                self.scratch = tempfile.mkdtemp(prefix="raytf-recovery-")
                self.next_job = dataclasses.replace(self.job, checkpoint_dir=self.scratch)
            self.placement = self.placer.reserve(self.layout, self.timeouts.placement_s)
            self.reserved = True
            if self.policy.elastic and self.placement is None:
                raise ConfigError(
                    "An elastic FailurePolicy (min_workers=...) reserves and resizes its own "
                    "resources, which it cannot do inside a caller's placement group (a Tune "
                    "trial). Drop min_workers for sweeps."
                )
        job, run = self.next_job, self.run_state
        backend, group, workers, servers = self._spawn_and_wire()
        self.attempt = Attempt(backend, group, job, Built(0, None, 0, 0), 0, 0)
        built = backend.build(group, job, recovering=bool(run.failures) or job.finished_ok)
        steps = built.steps
        start_epoch = built.start_epoch
        start_step = built.start_step if start_epoch < job.epochs else 0
        # Elastic per-worker batch: steps per epoch changed; the same share of the epoch.
        prior = run.steps_of.get(built.restored or "", steps)
        if prior != steps:
            start_step = start_step * steps // prior
        position = start_epoch * steps + start_step
        run.steps = steps
        if position:  # the data goes on where the checkpoint left it
            backend.seek(group, position)
        self.attempt = Attempt(backend, group, job, built, start_epoch, start_step)
        if run.failures and run.failures[-1].recovery_s is None:
            record = recovery.restarted(
                run.failures[-1], position, steps, built.restored, built.skipped, workers
            )
            run.failures[-1] = record
            trim_history(run, record.restored_epoch or 0)
            for cb in self.callbacks:
                cb.on_recovery(record)
        run.workers, run.servers = workers, servers
        if built.note and built.note not in self.explanation:
            self.explanation = f"{self.explanation} {built.note}"
        if not run.announced:
            announce(run, self, built, job)
        run.checkpoint_at = (position, time.time())
        if group.start_spares(len(run.failures) < self.policy.max_failures):
            self.spares_on = group  # a recovery takes them instead of starting cold (pool.py)
        return State.TRAIN

    def _spawn_and_wire(self) -> tuple[Backend, ActorGroup, list, list]:
        """A group with TensorFlow wired; a port lost to another process means a retry."""
        for attempt in range(1, BIND_ATTEMPTS + 1):
            backend = self.layout.backend_cls()(self.layout, self.timeouts, self)
            group = self.group_cls(
                self.placement,
                self.layout.bundles(),
                self.runtime_env,
                strategy=self.layout.placement_strategy,
            )
            try:
                backend.spawn(group)
                workers, servers = backend.start(group)
                return backend, group, workers, servers
            except WorkerError as exc:
                group.shutdown()
                if BIND_FAILURE not in str(exc) or attempt == BIND_ATTEMPTS:
                    raise
            except BaseException:
                group.shutdown()
                raise
        raise AssertionError("unreachable")  # the last attempt re-raises

    def _train(self) -> State:
        a, run, job = self.attempt, self.run_state, self.next_job
        assert a is not None
        if a.epoch >= job.epochs or run.stopped:
            report = a.backend.report(a.group)
            self.result = fit_result(self, report)
            # The user's Keras callback objects read as after model.fit (History, ...).
            chief = next(f for f in report.finals if "weights" in f)
            keras_callbacks.copy_back(
                job.keras_callbacks, chief.get("keras_callbacks") or (), run.history, run.epochs
            )
            self._stop_group(park=True)  # fresh actors wait for the next run (pool.py)
            return State.DONE
        steps = a.built.steps
        length = schedule.segment_length(
            steps, self.policy, run.rate, a.backend.mid_epoch_checkpoints
        )
        validation_steps = a.built.validation_steps if job.validates(a.epoch) else None
        segment = schedule.next_segment(a.epoch, a.step, steps, length, validation_steps)
        if segment.start == 0:
            a.backend.begin_epoch(a.group, a.epoch)
        run.segment = segment
        t0 = time.perf_counter()
        results = a.backend.train(a.group, segment, self.timeouts.epoch_limit(run.durations))
        seconds = time.perf_counter() - t0
        run.segment = None  # done: a failure from here on is not this segment's
        run.position = segment.position
        run.seconds[a.epoch] = run.seconds.get(a.epoch, 0.0) + seconds
        # Every worker stopped at one step (a Keras callback set stop_training): the epoch
        # ends there, with its logs.
        stopped_at = min((r["stopped_at"] for r in results if r.get("stopped_at")), default=None)
        trained = (stopped_at or segment.stop) - segment.start
        run.steps_trained += trained
        run.rate = trained / seconds if seconds and trained else run.rate
        if not segment.ends_epoch and stopped_at is None:
            a.step = segment.stop
            if job.checkpoint_dir:
                path = a.backend.save(a.group, a.epoch, a.step)
                run.checkpoint_at = (run.position, time.time())
                self._keep(path, steps)
                if self._can_grow():  # just checkpointed: restart at the full size
                    return self._grow()
            return State.TRAIN
        saved, run.stopped = self._finish_epoch(a, results, stopped_at or steps)
        a.epoch, a.step = a.epoch + 1, 0
        if run.stopped:
            return State.TRAIN  # to DONE, with the report
        if a.epoch < job.epochs and job.checkpoint_dir and self._can_grow():
            if not saved:  # the next epoch's start, so the full group goes on from here
                a.backend.save(a.group, a.epoch, 0)
            return self._grow()
        return State.TRAIN

    def _recover(self) -> State:
        self._stop_group()
        # Resume from this run's checkpoints (or the user's, when resuming).
        resume = self.job.resume or self.run_state.checkpoint is not None
        self.next_job = dataclasses.replace(self.next_job, resume=resume)
        if self.policy.elastic:
            self.resize_reason = "replacements unavailable"
            return State.RESIZE
        return State.START

    def _resize(self) -> State:
        """A new reservation for an elastic run: the full size if it can be had within
        ``replace_within_s``, else the largest size down to ``min_workers`` that fits."""
        self._stop_group()
        self._drop_spares()
        old = self.layout
        self.placer.release(self.placement)
        self.placement = None
        t0 = time.time()
        sizes = self.sizing.sizes()
        for i, n in enumerate(sizes):
            layout = self.full_layout.resized(n)
            assert layout is not None  # checked before the run: the layout resizes
            try:
                placement = self.placer.reserve(layout, self.sizing.wait_for(i))
            except PlacementError:
                continue
            self.layout, self.placement = layout, placement
            batch = self.sizing.batch_for(n)
            self.next_job = dataclasses.replace(self.next_job, global_batch_size=batch)
            if n != old.num_workers:
                record = ResizeRecord(
                    from_workers=old.num_workers,
                    to_workers=n,
                    reason=self.resize_reason,
                    position=self.run_state.position,
                    global_batch_size=batch,
                    reserve_s=time.time() - t0,
                )
                self.run_state.resizes.append(record)
                for cb in self.callbacks:
                    cb.on_resize(record)
            return State.START
        raise PlacementError(
            f"Could not reserve even min_workers={self.policy.min_workers} worker(s) of "
            f"{self.full_layout.describe()} (tried {sizes} worker(s); the full size for "
            f"{self.policy.replace_within_s:g}s, then {RESIZE_PROBE_S:g}s each): the cluster lost "
            "the resources. Add nodes, or lower min_workers."
        )

    # ------------------------------------------------------------------ helpers
    def _finish_epoch(
        self, a: Attempt, results: list[dict], trained: int
    ) -> tuple[str | None, bool]:
        """Merge the epoch's logs (``trained`` steps of it), let the backend make its
        callbacks' decisions global and checkpoint; the checkpoint and whether to stop."""
        run, job, epoch, steps = self.run_state, a.job, a.epoch, a.built.steps
        seconds = run.seconds.pop(epoch, 0.0)
        run.durations.append(seconds)
        logs = schedule.mean_logs(
            [r["logs"] for r in results],
            [r.get("steps") for r in results],
            [r.get("val_examples") for r in results],
        )
        # Checkpoint first: a driver callback that fails or kills must not cost the epoch.
        end = a.backend.end_epoch(a.group, epoch, results, logs)
        logs, saved = dict(end.logs), end.checkpoint
        run.epochs_done = epoch + 1
        if seconds:
            logs["examples_per_second"] = trained * job.global_batch_size / seconds
        rates = [r["throughput"] for r in results]
        if all(rates):  # steady state so far, tracing excluded: what sweeps rank on
            logs["throughput"] = sum(rates)
        run.epochs.append(epoch)
        for key, value in logs.items():
            run.history.setdefault(key, []).append(value)
            run.history_epochs.setdefault(key, []).append(epoch)
        run.global_step = results[0]["global_step"]
        if saved:
            run.checkpoint_at = ((epoch + 1) * steps, time.time())
            self._keep(saved, steps)
        for cb in self.callbacks:  # the checkpoint first: Tune reports it with the logs
            if saved:
                cb.on_checkpoint(epoch, saved)
            cb.on_epoch_end(epoch, logs)
        return saved, end.stop

    def _keep(self, path: str | None, steps: int) -> None:
        """The newest checkpoint (the chief's or server 0's path), and its steps per epoch."""
        if path:
            self.run_state.checkpoint = path
            self.run_state.steps_of[path] = steps

    def _can_grow(self) -> bool:
        """A shrunk elastic run: are the missing workers' resources free again?"""
        run, full = self.run_state, self.full_layout
        if not self.sizing.may_probe(
            self.layout.num_workers, time.monotonic(), run.probe_failed_at
        ):
            return False
        missing = full.bundles()[self.layout.num_workers :]
        if not self.placer.has_free(missing):
            return False
        if self.placer.probe(missing, full.placement_strategy):
            return True
        run.probe_failed_at = time.monotonic()
        return False

    def _grow(self) -> State:
        self.resize_reason = "resources returned"
        self.next_job = dataclasses.replace(self.next_job, resume=True)  # just checkpointed
        return State.RESIZE

    def _record_failure(self, error: RaytfError) -> None:
        run = self.run_state
        record = recovery.detected(
            error,
            len(run.failures) + 1,
            run.segment,
            run.position,
            run.steps,
            run.checkpoint_at[1],
        )
        run.failures.append(record)
        for cb in self.callbacks:
            cb.on_failure(record)

    def _drop_spares(self) -> None:
        if self.spares_on is not None:
            self.spares_on.drop_spares()
            self.spares_on = None

    def _stop_group(self, park: bool = False) -> None:
        if self.attempt is not None:
            self.attempt.group.shutdown(park=park)
            self.attempt = None

    # ------------------------------------------------------- RunHooks (in place)
    @contextlib.contextmanager
    def replacing(self, error: RaytfError) -> Iterator[None]:
        if len(self.run_state.failures) >= self.policy.max_failures:
            raise error
        self._record_failure(error)
        try:
            yield
        except Exception:
            self.run_state.failures.pop()  # the group restart records it instead
            raise error from None

    def replaced(self, row: dict[str, Any], redone: int, resumed_batch: int | None) -> None:
        run = self.run_state
        record = recovery.replaced_in_place(run.failures[-1], row, redone, resumed_batch)
        run.failures[-1] = record
        for cb in self.callbacks:
            cb.on_recovery(record)

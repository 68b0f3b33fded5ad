"""Lifecycle hooks called in the driver: progress, metrics, checkpoints, Tune reporting."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from raytf.layouts.base import Layout
    from raytf.records import FailureRecord, ResizeRecord, ServerRow, WorkerRow
    from raytf.result import FitResult


@dataclass(frozen=True)
class RunInfo:
    """What the run looks like once its actors are up; given to ``on_fit_start``."""

    layout: Layout
    explanation: str
    epochs: int
    start_epoch: int
    steps_per_epoch: int
    validation_steps: int | None
    global_batch_size: int
    workers: tuple[WorkerRow, ...]
    #: The checkpoint a resumed run restored, and newer ones skipped as unreadable.
    resumed_from: str | None = None
    skipped_checkpoints: tuple[str, ...] = ()
    #: Parameter-server layouts: the server actors (TensorFlow's backend: every task).
    servers: tuple[ServerRow, ...] = ()


class Callback:
    """Override what you need; every hook is a no-op by default."""

    def on_fit_start(self, run: RunInfo) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, epoch: int, path: str) -> None:
        """Epoch ``epoch`` ended with a checkpoint at ``path``; called just before that
        epoch's ``on_epoch_end``, so both can be reported together (Tune does)."""

    def on_failure(self, record: FailureRecord) -> None:
        """An actor died or was preempted and the failure policy allows a recovery."""

    def on_recovery(self, record: FailureRecord) -> None:
        """Training goes on: a new group restored a checkpoint, or (parameter servers) a
        replacement worker joined the running servers (``record.action``)."""

    def on_resize(self, record: ResizeRecord) -> None:
        """An elastic run changed its worker count (``record.from_workers`` to
        ``record.to_workers``); training goes on from the newest checkpoint."""

    def on_fit_end(self, result: FitResult) -> None:
        pass


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"


class ProgressLogger(Callback):
    """One line per epoch: loss, metrics, examples per second and time."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._last = time.perf_counter()
        self._checkpoint: str | None = None

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def on_fit_start(self, run: RunInfo) -> None:
        self._epochs = run.epochs
        self._print(f"raytf: layout {run.layout.describe()}")
        self._print(f"raytf: why: {run.explanation}")
        for w in run.workers:
            self._print(
                f"raytf:   {w.name} on {w.node_ip} pid {w.pid}: {len(w.devices)} x {w.device_kind}"
            )
        if run.resumed_from:
            self._print(f"raytf: resumed from {run.resumed_from}")
        for skipped in run.skipped_checkpoints:
            self._print(f"raytf: skipped unreadable checkpoint {skipped}")
        self._print(
            f"raytf: {run.steps_per_epoch} steps/epoch at global batch "
            f"{run.global_batch_size}, epochs {run.start_epoch + 1}..{run.epochs}"
        )
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        now = time.perf_counter()
        parts = [f"{k} {_fmt(v)}" for k, v in logs.items() if k != "examples_per_second"]
        rate = logs.get("examples_per_second")
        tail = f"  {rate:,.0f} ex/s" if rate else ""
        self._print(
            f"epoch {epoch + 1}/{self._epochs}  "
            + "  ".join(parts)
            + f"{tail}  {now - self._last:.1f}s"
        )
        self._last = now
        if self._checkpoint:
            self._print(f"raytf: checkpoint {self._checkpoint}")
            self._checkpoint = None

    def on_checkpoint(self, epoch: int, path: str) -> None:
        self._checkpoint = path  # printed after the epoch's line

    def on_failure(self, record: FailureRecord) -> None:
        first, stop = record.segment
        where = f"steps {first}-{stop}" if stop > first else f"between steps, at step {first}"
        self._print(
            f"raytf: failure {record.failure}: {record.worker or 'an actor'} "
            f"{record.reason} in epoch {record.epoch + 1}, {where} ({record.error[:160]})"
        )

    def on_recovery(self, record: FailureRecord) -> None:
        if record.action == "replaced in place":
            batch = record.resumed_batch
            where = f" from its batch {batch}" if batch is not None else ""
            pid = (record.replacement or {}).get("pid")
            self._print(
                f"raytf: recovered: {record.worker} replaced in place (pid {pid}), going "
                f"on{where} against the running servers; training again "
                f"{record.recovery_s or 0:.1f}s after the failure"
            )
            self._last = time.perf_counter()
            return
        restored = record.restored_checkpoint or "no checkpoint (from the start)"
        skipped = record.skipped_checkpoints
        self._print(
            f"raytf: recovered: restored {restored} (epoch {(record.restored_epoch or 0) + 1}, "
            f"step {record.restored_step})"
            + (f", skipping {len(skipped)} unreadable" if skipped else "")
            + f"; training again {record.recovery_s or 0:.1f}s after the failure, "
            f"at most {record.steps_redone} step(s) redone"
        )
        self._last = time.perf_counter()

    def on_resize(self, record: ResizeRecord) -> None:
        self._print(
            f"raytf: elastic: {record.from_workers} -> {record.to_workers} worker(s) "
            f"({record.reason}), global batch {record.global_batch_size}"
        )

    def on_fit_end(self, result: FitResult) -> None:
        if result.failures:
            self._print(
                f"raytf: {len(result.failures)} failure(s) recovered; {result.steps_trained} "
                f"steps trained, at most {result.steps_redone} redone, "
                f"{result.time_lost_s:.1f}s lost"
            )

"""What a run carries from one attempt to the next, and how it becomes the user's result."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from typing import TYPE_CHECKING, Any

from raytf._internal.job import Job
from raytf._internal.runtime.backend import Built, Report
from raytf._internal.runtime.schedule import Segment
from raytf.callbacks import RunInfo
from raytf.records import FailureRecord, ResizeRecord, ServerRow, WorkerRow
from raytf.result import FitResult

if TYPE_CHECKING:
    from raytf._internal.runtime.controller import Controller


@dataclasses.dataclass
class RunState:
    """The run so far, across attempts."""

    started: float
    history: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    durations: list[float] = dataclasses.field(default_factory=list)
    seconds: dict[int, float] = dataclasses.field(default_factory=dict)
    failures: list[FailureRecord] = dataclasses.field(default_factory=list)
    resizes: list[ResizeRecord] = dataclasses.field(default_factory=list)
    #: Steps per epoch of each checkpoint this run wrote (elastic runs change it).
    steps_of: dict[str, int] = dataclasses.field(default_factory=dict)
    #: When the last probe for an elastic run's missing resources failed.
    probe_failed_at: float = float("-inf")
    checkpoint: str | None = None
    checkpoint_at: tuple[int, float] = (0, 0.0)
    position: int = 0
    steps: int = 0  # per epoch
    segment: Segment | None = None
    global_step: int = 0
    steps_trained: int = 0
    start_epoch: int = 0
    epochs_done: int = 0  # the epoch after the last one finished
    #: The epochs finished (History.epoch), and the epoch of each history entry: val_*
    #: entries exist only for the epochs validation_freq picks.
    epochs: list[int] = dataclasses.field(default_factory=list)
    history_epochs: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    stopped: bool = False  # a Keras callback stopped training: no epoch after this one
    rate: float | None = None
    announced: bool = False
    resumed_from: str | None = None
    #: The current attempt's actors (start-up rows), for RunInfo and the result.
    workers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    servers: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def row(cls: type, *parts: dict[str, Any]) -> Any:
    """A WorkerRow/ServerRow from dicts of what was learned; keys it has no field for go."""
    names = {f.name for f in dataclasses.fields(cls)}
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update({k: v for k, v in part.items() if k in names})
    for key in ("gpu_ids", "devices", "holds"):
        if isinstance(merged.get(key), list):
            merged[key] = tuple(merged[key])
    return cls(**merged)


def trim_history(run: RunState, restored_epoch: int) -> None:
    """Epochs after the restored one are trained again: their history entries go."""
    run.epochs = [e for e in run.epochs if e < restored_epoch]
    for key, epochs in run.history_epochs.items():
        keep = sum(e < restored_epoch for e in epochs)
        del run.history[key][keep:]
        del epochs[keep:]


def announce(run: RunState, controller: Controller, built: Built, job: Job) -> None:
    """The first attempt is up: tell the callbacks what the run looks like."""
    run.announced = True
    run.start_epoch = built.start_epoch
    run.resumed_from = built.restored if controller.job.resume else None
    info = RunInfo(
        controller.layout,
        controller.explanation,
        job.epochs,
        built.start_epoch,
        built.steps,
        # WHOLE (-1): every example; RunInfo says None (no fixed count).
        built.validation_steps if (built.validation_steps or 0) > 0 else None,
        job.global_batch_size,
        tuple(row(WorkerRow, w) for w in run.workers),
        built.restored,
        built.skipped,
        tuple(row(ServerRow, s) for s in run.servers),
    )
    for cb in controller.callbacks:
        cb.on_fit_start(info)


def fit_result(controller: Controller, report: Report) -> FitResult:
    run, job = controller.run_state, controller.job
    finals = report.finals
    chief = next(f for f in finals if "weights" in f)  # the one that sent the model
    # The actors that ran raytf's loop (TensorFlow's worker tasks only serve).
    throughputs = [f["throughput"] for f in finals if "throughput" in f]
    firsts = [f["first_step_at"] for f in finals if f.get("first_step_at")]
    failures = list(run.failures)
    return FitResult(
        layout=controller.layout,
        explanation=controller.explanation,
        history=run.history,
        throughput=sum(throughputs) if all(throughputs) else None,
        worker_throughput=throughputs,
        time_to_first_step_s=(max(firsts) - run.started) if firsts else None,
        wall_time_s=time.time() - run.started,
        epochs_trained=max(0, run.epochs_done - run.start_epoch),
        global_step=run.global_step if report.global_step is None else report.global_step,
        weights=chief["weights"],
        model_path=_write_model(controller.model_dir, chief.get("model_bytes")),
        checkpoint=None if job.checkpoint_dir is None else run.checkpoint,
        workers=[row(WorkerRow, w, f) for w, f in zip(run.workers, finals)],
        servers=[row(ServerRow, s) for s in report.servers],
        staleness=report.staleness,
        steps_ahead=report.steps_ahead,
        failures=failures,
        steps_trained=run.steps_trained + sum(f.partial for f in failures),
        steps_redone=sum(f.steps_redone for f in failures),
        time_lost_s=sum(f.time_lost_s for f in failures),
        resumed_from=run.resumed_from,
        resizes=list(run.resizes),
    )


def _write_model(directory: str | None, model_bytes: bytes | None) -> str | None:
    if model_bytes is None:
        return None
    directory = directory or tempfile.mkdtemp(prefix="raytf-model-")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "model.keras")
    with open(path, "wb") as f:
        f.write(model_bytes)
    return path

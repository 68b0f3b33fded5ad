"""Typed records a run hands to callbacks and returns in :class:`raytf.FitResult`.

Frozen dataclasses: read fields as attributes (``record.steps_redone``), print them, or turn
them into plain dicts with :meth:`to_dict` (for JSON, pandas, Tune).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class _Record:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class _ActorRow(_Record):
    """Where an actor ran and what Ray gave it."""

    name: str
    pid: int | None = None
    node_ip: str | None = None
    node_id: str | None = None
    gpu_ids: tuple[str, ...] = ()
    cuda_visible_devices: str | None = None
    role: str = "worker"
    #: host:port the actor's TensorFlow server bound (all-reduce, TensorFlow's PS backend).
    address: str | None = None


@dataclass(frozen=True)
class WorkerRow(_ActorRow):
    """One worker actor of the run: where it ran, what it was given, and what it measured.

    Parameter-server runs list their worker actors here (TensorFlow's backend: its worker
    tasks, then the chief that drives them); server actors are :class:`ServerRow`.
    """

    devices: tuple[str, ...] = ()
    device_kind: str | None = None
    #: sha256 of the final weights (equal on every replica of a synchronous run).
    fingerprint: str | None = None
    #: Examples/second after the first (tracing) call.
    throughput: float | None = None
    steps_per_second: float | None = None
    #: Parameter-server workers: seconds waiting for weights, computing and pushing.
    timing: dict[str, Any] | None = None
    model_save_error: str | None = None


@dataclass(frozen=True)
class ServerRow(_ActorRow):
    """One parameter server: where it ran, what it holds and the load it carried."""

    role: str = "ps"
    #: Names of the model and optimizer variables this server holds.
    holds: tuple[str, ...] = ()
    variables: int | None = None
    bytes: int | None = None
    #: The number of updates it applied (its weights' version) at the end.
    version: int | None = None
    pushes: int = 0
    pulls: int = 0
    applied: int = 0
    #: Gradients refused: late in a synchronous step, after an epoch closed, from a dead worker.
    dropped: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    apply_seconds: float = 0.0
    wait_seconds: float = 0.0
    #: How pulls and pushes travelled ("tcp" or "object-store").
    transport: str | None = None
    #: Whether its update ran as one XLA computation (False: an op XLA cannot lower).
    xla: bool | None = None
    #: Histograms {value: count}: staleness of applied gradients, and steps workers ran ahead.
    staleness: dict[int, int] = field(default_factory=dict)
    steps_ahead: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FailureRecord(_Record):
    """A failure the :class:`raytf.FailurePolicy` recovered from, and what it cost.

    ``on_failure`` receives it as detected; ``on_recovery`` the completed record (``action``,
    what was restored, ``steps_redone``, ``recovery_s``, ``time_lost_s``).
    """

    failure: int  # 1 for the run's first
    worker: str | None  # the actor that died or got SIGTERM
    reason: str  # "died" | "preempted"
    error: str  # the first line of what was raised
    epoch: int  # 0-based epoch it happened in
    segment: tuple[int, int]  # the steps of the segment under way (first, stop)
    steps_per_epoch: int
    detected_at: float  # wall clock
    reached: int  # run position (epoch x steps + step) the work may have reached
    partial: int  # steps of the failed segment done before it, at most
    checkpoint: str | None = None  # a preempted worker's checkpoint
    stopped_at: int | None = None  # the position that checkpoint holds
    since_checkpoint_s: float = 0.0
    action: str | None = None  # "restarted the group" | "replaced in place"
    restored_checkpoint: str | None = None
    skipped_checkpoints: tuple[str, ...] = ()
    restored_epoch: int | None = None
    restored_step: int | None = None
    restarted_on: tuple[dict[str, Any], ...] = ()  # name, pid, node_ip of the new group
    replacement: dict[str, Any] | None = None  # pid, node_ip, node_id of an in-place one
    resumed_batch: int | None = None  # where an in-place replacement's data went on
    steps_redone: int = 0  # an upper bound
    recovery_s: float | None = None  # detection to training again
    time_lost_s: float = 0.0  # work since the last checkpoint plus recovery_s


@dataclass(frozen=True)
class ResizeRecord(_Record):
    """An elastic run changed its worker count."""

    from_workers: int
    to_workers: int
    reason: str
    position: int  # run position (epoch x steps + step) it went on from
    global_batch_size: int
    reserve_s: float

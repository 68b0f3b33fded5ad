"""The backend contract: how one family of layouts runs, under raytf's one generic controller.

The controller owns the run (placement, attempts, recovery, segments, callbacks, the result);
a backend owns its actors' protocol: which actors to spawn, how to wire TensorFlow, how to
train one segment, save, and report. A new layout brings a backend that implements this
class; it never subclasses the controller, the group or another backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from raytf._internal.job import Job
from raytf._internal.runtime.group import ActorGroup
from raytf._internal.runtime.schedule import Segment
from raytf._internal.spec import StrategySpec
from raytf.config import Timeouts
from raytf.errors import RaytfError
from raytf.layouts.base import Layout

#: Set to 1 in the driver to let actors given GPUs TensorFlow cannot see (fake GPUs declared
#: to Ray in tests and demos) train on logical CPU devices instead of failing.
STANDIN_ENV = "RAYTF_CPU_STANDIN"


class RunHooks(Protocol):
    """What the controller offers a backend that replaces an actor while the others run on."""

    def replacing(self, error: RaytfError) -> contextlib.AbstractContextManager[None]:
        """Record ``error`` and replace inside the ``with``; if the policy allows no more
        failures, or the replacement fails, ``error`` ends the attempt instead."""

    def replaced(self, row: dict[str, Any], redone: int, resumed_batch: int | None) -> None:
        """The replacement (``row``: its pid and node) trains: complete the record."""


@dataclass(frozen=True)
class Built:
    """What every worker agreed on once the model and data were built."""

    steps: int  # per epoch
    validation_steps: int | None
    start_epoch: int
    start_step: int
    restored: str | None = None
    skipped: tuple[str, ...] = ()
    #: What the workers changed about the layout once they saw the model, for the user.
    note: str | None = None


@dataclass(frozen=True)
class EpochEnd:
    """What the end of an epoch decided: the checkpoint written, the epoch's logs (after the
    Keras callbacks, which may add some) and whether any worker's callbacks stop training."""

    checkpoint: str | None
    logs: dict[str, float]
    stop: bool = False


@dataclass
class Report:
    """What a backend reads from its actors before they stop."""

    #: Per worker row of ``start``: fingerprint, throughput, ...; the chief's has the weights.
    finals: list[dict[str, Any]]
    servers: list[dict[str, Any]] = field(default_factory=list)
    staleness: dict[str, Any] | None = None
    steps_ahead: dict[str, Any] | None = None
    global_step: int | None = None


class Backend(ABC):
    """One attempt's actors for ``layout``: made by the controller per attempt."""

    #: Whether epochs may stop mid-way at the failure policy's checkpoint intervals.
    mid_epoch_checkpoints: ClassVar[bool] = True

    def __init__(self, layout: Layout, timeouts: Timeouts, hooks: RunHooks) -> None:
        self.layout = layout
        self.timeouts = timeouts
        self.hooks = hooks

    def strategy_specs(self, addresses: list[str] | None) -> list[StrategySpec]:
        """The layout's specs, with the driver's CPU stand-in opt-in (RAYTF_CPU_STANDIN=1)."""
        standin = os.environ.get(STANDIN_ENV, "").lower() in ("1", "true", "yes")
        specs = self.layout.strategy_specs(addresses)
        return [dataclasses.replace(s, cpu_standin=standin) for s in specs]

    @abstractmethod
    def spawn(self, group: ActorGroup) -> None:
        """Start this layout's actors in ``group`` (they import TensorFlow meanwhile)."""

    @abstractmethod
    def start(self, group: ActorGroup) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Wire TensorFlow (devices, strategies, peers): the rows of the worker actors and
        of the server actors, for the run's report."""

    @abstractmethod
    def build(self, group: ActorGroup, job: Job, recovering: bool) -> Built:
        """Build model, data and checkpoint state everywhere (restoring when resuming)."""

    @abstractmethod
    def seek(self, group: ActorGroup, position: int) -> None:
        """Move every worker's data to ``position`` (epoch x steps + step) after a restore."""

    @abstractmethod
    def train(self, group: ActorGroup, segment: Segment, timeout_s: float) -> list[dict]:
        """Train one segment on every worker: one result per worker (logs at epoch ends)."""

    @abstractmethod
    def save(self, group: ActorGroup, epoch: int, step: int) -> str | None:
        """A checkpoint at ``step`` of ``epoch``: its path (None if no checkpoint_dir)."""

    def begin_epoch(self, group: ActorGroup, epoch: int) -> None:  # noqa: B027 (optional)
        """Before ``epoch``'s first step, where the workers do not run it themselves (they
        call ``on_epoch_begin`` at the start of their own ``run_epoch``)."""

    @abstractmethod
    def end_epoch(
        self, group: ActorGroup, epoch: int, results: list[dict], logs: dict[str, float]
    ) -> EpochEnd:
        """After every worker finished ``epoch`` (``logs``: merged): make the callbacks'
        decisions global; the checkpoint written, the logs, and whether to stop."""

    @abstractmethod
    def report(self, group: ActorGroup) -> Report:
        """The final model and what the actors measured."""

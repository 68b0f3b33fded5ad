"""Lifecycle hooks called in the driver: progress, metrics, checkpoints, Tune reporting."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from raytf.layouts.base import Layout
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
    workers: tuple[dict[str, Any], ...]


class Callback:
    """Override what you need; every hook is a no-op by default."""

    def on_fit_start(self, run: RunInfo) -> None:
        pass

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, epoch: int, path: str) -> None:
        pass

    def on_fit_end(self, result: FitResult) -> None:
        pass


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"


class ProgressLogger(Callback):
    """One line per epoch: loss, metrics, examples per second and time."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._last = time.perf_counter()

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def on_fit_start(self, run: RunInfo) -> None:
        self._epochs = run.epochs
        self._print(f"raytf: layout {run.layout.describe()}")
        self._print(f"raytf: why: {run.explanation}")
        for w in run.workers:
            self._print(
                f"raytf:   {w['name']} on {w['node_ip']} pid {w['pid']}: "
                f"{len(w['devices'])} x {w['device_kind']}"
            )
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

    def on_checkpoint(self, epoch: int, path: str) -> None:
        self._print(f"raytf: checkpoint {path}")

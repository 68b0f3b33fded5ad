"""Stopping under all-reduce: every worker stops at the same step when any got SIGTERM, or
when any set ``model.stop_training`` (a Keras callback such as TerminateOnNaN).

Before each call of K steps the workers all-reduce one number, each setting its own bit if
it was signalled, and one bit more if it wants to stop, so they all see who is leaving:
signalled ones checkpoint together at that step and raise :class:`Preempted` (the driver
restarts the group from exactly there); a stop ends the epoch there on every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from raytf.errors import Preempted


class Agreement:
    """Who got SIGTERM, agreed by every worker of ``num_workers``."""

    def __init__(
        self, strategy: Any, worker_index: int, num_workers: int, replicas_per_worker: int
    ) -> None:
        self.strategy = strategy
        self.index = worker_index
        self.workers = num_workers
        self.replicas = replicas_per_worker
        self._agree: Any = None  # traced on first use

    def stopping(self, preempted: bool, stop: bool, collective: bool) -> tuple[list[int], bool]:
        """The workers that got SIGTERM, and whether any wants to stop training. Alone (or
        without collectives), this one's flags."""
        if self.workers == 1 or not collective:
            return ([self.index] if preempted else []), stop
        if self._agree is None:
            strategy = self.strategy

            @tf.function
            def agree(bit: tf.Tensor) -> tf.Tensor:
                value = strategy.run(lambda: tf.identity(bit))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

            self._agree = agree
        # Worker i's SIGTERM is bit i; a stop request counts 2**workers (several may add up:
        # any amount at or above it means stop).
        bits = (float(2**self.index) if preempted else 0.0) + (
            float(2**self.workers) if stop else 0.0
        )
        # Every replica of a worker adds its worker's bits: divide by the replicas per worker.
        total = float(self._agree(tf.constant(bits, tf.float64)).numpy())
        mask = round(total / self.replicas)
        signalled = [i for i in range(self.workers) if mask >> i & 1]
        return signalled, mask >= 2**self.workers

    def stop(
        self,
        stopping: list[int],
        epoch: int,
        step: int,
        epoch_steps: int,
        save: Callable[[int, int], str | None] | None,
    ) -> None:
        """Checkpoint at ``step`` (every worker takes part; the chief's copy is kept), then
        raise Preempted so the driver restarts the group from exactly here."""
        name = "worker" if self.workers == 1 else "worker-{}"
        who = ", ".join(name.format(i) for i in stopping)
        path, position = None, None
        if save is None:
            saved = "no checkpoint written (no checkpoint_dir)"
        else:
            path, position = save(epoch, step), epoch * epoch_steps + step
            saved = f"checkpoint {path} written" if path else "checkpoint written by the chief"
        raise Preempted(
            f"{who} got SIGTERM at epoch {epoch + 1}, step {step}; {saved} before exiting.",
            checkpoint=path,
            position=position,
            worker=name.format(stopping[0]),
        )

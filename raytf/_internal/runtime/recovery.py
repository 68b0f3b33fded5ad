"""Failure records, pure: what a failure cost, from where training stood and what came back.

The controller calls :func:`detected` when a failure the policy tolerates arrives, then
:func:`restarted` (a new group restored a checkpoint) or :func:`replaced_in_place` (a
backend replaced one actor while the rest ran on). Each returns a new frozen record.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from raytf._internal.runtime.schedule import Segment
from raytf.errors import Preempted, RaytfError
from raytf.records import FailureRecord


def detected(
    error: RaytfError,
    number: int,
    segment: Segment | None,
    position: int,
    steps: int,
    checkpoint_time: float,
    now: float | None = None,
) -> FailureRecord:
    """The record of failure ``number``, raised during ``segment`` (None: between segments,
    at ``position``, where no training was under way)."""
    now = time.time() if now is None else now
    if segment is not None:
        epoch, first, stop = segment.epoch, segment.start, segment.stop
        reached, partial = segment.position, segment.stop - segment.start
    else:
        epoch, first = divmod(position, steps or 1)
        stop, reached, partial = first, position, 0
    preempted = isinstance(error, Preempted)
    return FailureRecord(
        failure=number,
        worker=getattr(error, "worker", None),
        reason="preempted" if preempted else "died",
        error=str(error).splitlines()[0][:300],
        epoch=epoch,
        segment=(first, stop),
        steps_per_epoch=steps,
        detected_at=now,
        # Work since the last checkpoint: at most the failed segment's end (a death
        # mid-segment); a preempted worker checkpointed where it stopped.
        reached=reached,
        partial=partial,
        checkpoint=getattr(error, "checkpoint", None),
        stopped_at=getattr(error, "position", None),
        since_checkpoint_s=now - checkpoint_time,
    )


def restarted(
    record: FailureRecord,
    position: int,
    steps: int,
    restored: str | None,
    skipped: Sequence[str],
    workers: Sequence[dict[str, Any]],
    now: float | None = None,
) -> FailureRecord:
    """A new group restored ``restored`` and goes on from ``position`` at ``steps`` a epoch."""
    now = time.time() if now is None else now
    reached, partial, since = record.reached, record.partial, record.since_checkpoint_s
    if record.reason == "preempted" and record.stopped_at == position:
        # It checkpointed where it stopped and that is what came back: nothing redone.
        partial = max(0, position - (reached - partial))
        reached, since = position, 0.0
    if record.steps_per_epoch and record.steps_per_epoch != steps:  # an elastic resize
        e, st = divmod(reached, record.steps_per_epoch)
        reached = e * steps + st * steps // record.steps_per_epoch
    recovery_s = now - record.detected_at
    restored_epoch, restored_step = divmod(position, steps)
    return dataclasses.replace(
        record,
        action="restarted the group",
        restarted_on=tuple(
            {k: w[k] for k in ("name", "pid", "node_ip") if k in w} for w in workers
        ),
        reached=reached,
        partial=partial,
        since_checkpoint_s=since,
        restored_checkpoint=restored,
        skipped_checkpoints=tuple(skipped),
        restored_epoch=restored_epoch,
        restored_step=restored_step,
        steps_redone=max(0, reached - position),
        recovery_s=recovery_s,
        time_lost_s=since + recovery_s,
    )


def replaced_in_place(
    record: FailureRecord,
    replacement: dict[str, Any],
    redone: int,
    resumed_batch: int | None,
    now: float | None = None,
) -> FailureRecord:
    """One actor was replaced while the others trained on (or waited at a barrier)."""
    now = time.time() if now is None else now
    recovery_s = now - record.detected_at
    return dataclasses.replace(
        record,
        action="replaced in place",
        replacement={k: replacement.get(k) for k in ("pid", "node_ip", "node_id")},
        partial=0,  # the segment goes on and counts its steps when it ends
        steps_redone=redone,
        resumed_batch=resumed_batch,
        recovery_s=recovery_s,
        time_lost_s=recovery_s,  # the others kept training meanwhile: at most this
    )

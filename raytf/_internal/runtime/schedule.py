"""Where training stands and how an epoch splits into segments: pure, no Ray, no TensorFlow.

A segment is the steps between two checkpoints of the failure policy: a failure redoes at
most one. Epoch logs from several workers are merged here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raytf.config import FailurePolicy
from raytf.errors import ConfigError


@dataclass(frozen=True)
class Segment:
    """Steps ``start``..``stop`` of ``epoch``, which has ``steps`` steps."""

    epoch: int
    start: int
    stop: int
    steps: int
    validation_steps: int | None = None

    @property
    def ends_epoch(self) -> bool:
        return self.stop >= self.steps

    @property
    def position(self) -> int:
        """The run position once the segment is done (epoch x steps + step)."""
        return self.epoch * self.steps + self.stop

    def args(self) -> tuple:
        """What a worker's ``run_epoch`` takes."""
        return (self.epoch, self.steps, self.validation_steps, self.start, self.stop)


def segment_length(
    steps: int, policy: FailurePolicy, rate: float | None, mid_epoch: bool = True
) -> int:
    """Steps between mid-epoch checkpoints: the policy's count, or its seconds at the
    measured step rate; a whole epoch when the policy asks for neither (or the backend
    cannot stop mid-epoch)."""
    if not mid_epoch:
        return steps
    if policy.checkpoint_every_steps:
        return min(steps, policy.checkpoint_every_steps)
    if policy.checkpoint_every_s:
        if rate:
            return max(1, min(steps, int(rate * policy.checkpoint_every_s)))
        return max(1, steps // 10)  # until a rate is measured
    return steps


def next_segment(
    epoch: int, first: int, steps: int, length: int, validation_steps: int | None = None
) -> Segment:
    """The segment of ``epoch`` that starts at step ``first`` and runs ``length`` steps (fewer
    at the epoch's end); the caller asks again with a new length once a rate is measured."""
    return Segment(epoch, first, min(steps, first + length), steps, validation_steps)


def agreed_start(starts: Sequence[int], epochs: int, where: str | None, recovering: bool) -> int:
    """The epoch every worker resumes from; they must agree (one shared checkpoint_dir)."""
    found = sorted(set(starts))
    if len(found) > 1:
        raise ConfigError(
            f"Workers found different checkpoints to resume from (epochs {found}) in "
            f"{where!r}: checkpoint_dir must be storage every node can read (NFS, a mounted "
            "bucket), or the replicas would diverge."
        )
    if found[0] >= epochs and not recovering:  # a recovery may only need `final`
        raise ConfigError(
            f"The checkpoint in {where!r} is at epoch {found[0]}, and epochs={epochs}: "
            "nothing is left to train. Pass a larger epochs= to continue."
        )
    return found[0]


def agreed_step(steps_at: Sequence[int], where: str | None, who: str = "Workers") -> int:
    found = sorted(set(steps_at))
    if len(found) > 1:
        tail = ", written by one run" if who != "Workers" else ""
        raise ConfigError(
            f"{who} restored different steps {found} from {where!r}: checkpoint_dir must be "
            f"storage every node can read (NFS, a mounted bucket){tail}."
        )
    return found[0]


def mean_logs(
    per_worker: Sequence[dict[str, float]],
    steps: Sequence[int | None] = (),
    val_examples: Sequence[float | None] = (),
) -> dict[str, float]:
    """The global value of each log.

    Under all-reduce the metric variables are read collectively, so every worker already
    reports the global value and the mean changes nothing; it is kept for layouts whose
    workers report their own share. Workers that say how many steps they trained (parameter
    servers: asynchronous shares differ, a replacement may join late or do none) weigh their
    training logs by them, and their validation logs by the examples of their validation
    shard (``val_examples``: shards differ by the remainder; equal weights otherwise).
    """
    plain = [1.0] * len(per_worker)

    def weighing(counts: Sequence[float | None]) -> list[float]:
        known = [float(n) for n in counts if n is not None]
        if counts and len(known) == len(counts) and sum(known):
            return known
        return plain

    weights, val_weights = weighing(steps), weighing(val_examples)
    out = {}
    for k in per_worker[0]:
        w = val_weights if k.startswith("val_") else weights
        out[k] = sum(x[k] * wi for x, wi in zip(per_worker, w)) / sum(w)
    return out

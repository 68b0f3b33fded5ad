"""Run-level settings that are not about the model: timeouts."""

from __future__ import annotations

from dataclasses import dataclass, fields

from raytf._internal.checks import non_negative_int, positive_int, positive_number
from raytf.errors import ConfigError

FIRST_EPOCH_LIMIT_S = 24 * 3600.0
#: Steps per tf.function call when ``steps_per_execution="auto"``.
AUTO_STEPS_PER_EXECUTION = 50
#: What an elastic job keeps fixed when its worker count changes.
ELASTIC_BATCH = ("global", "per_worker")
MIN_EPOCH_LIMIT_S = 600.0


@dataclass(frozen=True)
class Timeouts:
    """Every wait raytf makes is bounded; when one runs out, the actors are torn down.

    - ``placement_s``: reserving the layout's resources (busy cluster).
    - ``start_s``: actor processes up with TensorFlow imported, and the model and data built.
    - ``peers_s``: TensorFlow peers connected (a missing peer otherwise blocks for minutes).
    - ``epoch_s``: one epoch of training and validation. ``None`` (default) adapts: 24 hours
      for the first epoch, then five times the longest epoch so far (at least 10 minutes).
      A dead actor is noticed at once whatever this says; it bounds hangs of live actors.
    """

    placement_s: float = 60.0
    start_s: float = 180.0
    peers_s: float = 60.0
    epoch_s: float | None = None

    def epoch_limit(self, durations: list[float]) -> float:
        if self.epoch_s is not None:
            return self.epoch_s
        if not durations:
            return FIRST_EPOCH_LIMIT_S
        return max(MIN_EPOCH_LIMIT_S, 5 * max(durations))

    def __post_init__(self) -> None:
        for f in fields(self):
            positive_number(
                f"Timeouts.{f.name}",
                getattr(self, f.name),
                "It counts seconds.",
                allow_none=f.name == "epoch_s",
            )


@dataclass(frozen=True)
class FailurePolicy:
    """What a run does when an actor dies (process killed, node lost, preempted).

    - ``max_failures``: recoveries allowed before the run fails (0: fail on the first).
    - ``checkpoint_every_steps`` / ``checkpoint_every_s``: how often workers checkpoint within
      an epoch, bounding the work redone after a failure (and at the epochs
      ``checkpoint_every`` says).

    On a failure raytf stops the group, starts a new one (elsewhere if the old resources are
    gone), restores the newest checkpoint that reads back whole and continues; parameter-server
    layouts instead replace a dead worker in place while the servers run on. The result lists
    each failure and what it cost. Errors in your own code (a bad data path, a typo) are not
    retried: they would fail again. Without ``checkpoint_dir`` raytf checkpoints to a temporary
    directory on this machine (fine on one node; give shared storage across nodes).

    Elastic all-reduce (``min_workers``): when the resources of a lost worker cannot be had
    again within ``replace_within_s`` (its node is gone and no other has room), go on with
    fewer workers, down to ``min_workers``, and grow back to the full size at the next
    segment boundary once the resources return. ``elastic_batch`` says what stays fixed:
    ``"global"`` keeps ``global_batch_size`` (each worker's share grows; worker counts that
    do not divide it are skipped) so steps and learning rate mean the same; ``"per_worker"``
    keeps each worker's batch and the global batch shrinks with the workers.
    """

    max_failures: int = 0
    checkpoint_every_steps: int | None = None
    checkpoint_every_s: float | None = None
    min_workers: int | None = None
    elastic_batch: str = "global"
    replace_within_s: float = 60.0

    @property
    def elastic(self) -> bool:
        return self.min_workers is not None

    def __post_init__(self) -> None:
        m = self.max_failures
        non_negative_int("FailurePolicy.max_failures", m, "0 fails on the first failure.")
        positive_int(
            "FailurePolicy.checkpoint_every_steps",
            self.checkpoint_every_steps,
            "It counts training steps.",
            allow_none=True,
        )
        positive_number(
            "FailurePolicy.checkpoint_every_s",
            self.checkpoint_every_s,
            "It counts seconds.",
            allow_none=True,
        )
        w = self.min_workers
        positive_int("FailurePolicy.min_workers", w, "None means not elastic.", allow_none=True)
        if w is not None and m < 1:
            raise ConfigError(
                f"FailurePolicy(min_workers={w}) shrinks the job after a failure, but "
                f"max_failures={m} allows none; pass max_failures=1 or more."
            )
        if self.elastic_batch not in ELASTIC_BATCH:
            raise ConfigError(
                f"FailurePolicy.elastic_batch must be one of {list(ELASTIC_BATCH)}, received "
                f"{self.elastic_batch!r}."
            )
        positive_number(
            "FailurePolicy.replace_within_s", self.replace_within_s, "It counts seconds."
        )

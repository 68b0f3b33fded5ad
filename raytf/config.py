"""Run-level settings that are not about the model: timeouts."""

from __future__ import annotations

from dataclasses import dataclass, fields

from raytf.errors import ConfigError

FIRST_EPOCH_LIMIT_S = 24 * 3600.0
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
            value = getattr(self, f.name)
            if value is None and f.name == "epoch_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(
                    f"Timeouts.{f.name} must be a positive number of seconds, received {value!r}."
                )


@dataclass(frozen=True)
class FailurePolicy:
    """What a run does when an actor dies (process killed, node lost, preempted).

    - ``max_failures``: recoveries allowed before the run fails (0: fail on the first).
    - ``checkpoint_every_steps`` / ``checkpoint_every_s``: how often workers checkpoint within
      an epoch, bounding the work redone after a failure (and at the epochs
      ``checkpoint_every`` says).

    On a failure raytf stops the group, starts a new one (elsewhere if the old resources are
    gone), restores the newest checkpoint that reads back whole and continues; the result lists
    each failure and what it cost. Errors in your own code (a bad data path, a typo) are not
    retried: they would fail again. Without ``checkpoint_dir`` raytf checkpoints to a temporary
    directory on this machine (fine on one node; give shared storage across nodes).
    """

    max_failures: int = 0
    checkpoint_every_steps: int | None = None
    checkpoint_every_s: float | None = None

    def __post_init__(self) -> None:
        m = self.max_failures
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ConfigError(
                f"FailurePolicy.max_failures must be an integer >= 0, received {m!r}."
            )
        n = self.checkpoint_every_steps
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(
                f"FailurePolicy.checkpoint_every_steps must be a positive integer or None, "
                f"received {n!r}."
            )
        s = self.checkpoint_every_s
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or s <= 0):
            raise ConfigError(
                f"FailurePolicy.checkpoint_every_s must be a positive number of seconds or "
                f"None, received {s!r}."
            )

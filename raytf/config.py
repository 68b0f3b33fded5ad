"""Run-level settings that are not about the model: timeouts."""

from __future__ import annotations

from dataclasses import dataclass, fields

from raytf.errors import ConfigError


@dataclass(frozen=True)
class Timeouts:
    """Every wait raytf makes is bounded; when one runs out, the actors are torn down.

    - ``placement_s``: reserving the layout's resources (busy cluster).
    - ``start_s``: actor processes up with TensorFlow imported, and the model and data built.
    - ``peers_s``: TensorFlow peers connected (a missing peer otherwise blocks for minutes).
    - ``epoch_s``: one epoch of training and validation.
    """

    placement_s: float = 60.0
    start_s: float = 180.0
    peers_s: float = 60.0
    epoch_s: float = 3600.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(
                    f"Timeouts.{f.name} must be a positive number of seconds, received {value!r}."
                )

"""What :func:`raytf.fit` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from raytf.layouts.base import Layout
    from raytf.records import FailureRecord, ResizeRecord, ServerRow, WorkerRow


@dataclass(frozen=True)
class FitResult:
    """The trained model and what the run measured.

    ``weights`` load into your own model with ``model.set_weights(result.weights)``;
    ``model_path`` is a ``.keras`` file (``load_model()`` reads it). ``throughput`` is global
    examples per second after the first (tracing) step; ``worker_throughput`` is per worker;
    ``workers`` has a row per worker actor (where it ran, its step rate and timing).
    """

    layout: Layout
    explanation: str
    history: dict[str, list[float]]
    throughput: float | None
    worker_throughput: list[float | None]
    time_to_first_step_s: float | None
    wall_time_s: float
    epochs_trained: int
    global_step: int
    weights: list[np.ndarray] = field(repr=False)
    model_path: str | None
    checkpoint: str | None
    workers: list[WorkerRow] = field(repr=False)
    #: Parameter-server layouts: each server's load (pushes, pulls, bytes, busy seconds).
    servers: list[ServerRow] = field(default_factory=list, repr=False)
    #: Parameter-server layouts: how stale the applied gradients were (in versions of the
    #: server's weights) and how far workers ran ahead of the slowest (in steps), as
    #: ``{"histogram": {value: count}, "p50": ..., "p90": ..., "p99": ..., "max": ...}``.
    staleness: dict[str, Any] | None = None
    steps_ahead: dict[str, Any] | None = None
    #: One record per failure recovered from (see FailurePolicy): who, why, where, the
    #: checkpoint restored, ``steps_redone`` (at most), ``recovery_s`` and ``time_lost_s``.
    failures: list[FailureRecord] = field(default_factory=list, repr=False)
    #: Training steps executed by this call, redone ones included.
    steps_trained: int = 0
    #: Steps trained twice because of failures (an upper bound: a worker that died mid-way
    #: through a segment may not have reached its end).
    steps_redone: int = 0
    #: Work since the last checkpoint plus the time to get training again, over all failures.
    time_lost_s: float = 0.0
    #: The checkpoint a ``resume=True`` run started from (newer unreadable ones skipped).
    resumed_from: str | None = None
    #: Elastic runs: each change of worker count (from, to, why, at which step, the batch).
    resizes: list[ResizeRecord] = field(default_factory=list, repr=False)

    def load_model(self, **kwargs: Any) -> Any:
        """The final model as a ``keras.Model``, read from :attr:`model_path`."""
        import keras

        if self.model_path is None:
            from raytf.errors import RaytfError

            raise RaytfError(
                "The final model could not be saved as a .keras file (see the worker's "
                "model_save_error in result.workers); load result.weights into your model "
                "with model.set_weights(result.weights)."
            )
        return keras.models.load_model(self.model_path, **kwargs)

"""raytf's errors: one root, picklable, each message naming what was received and the fix."""

from __future__ import annotations


class RaytfError(Exception):
    """Root of every error raytf raises on purpose."""

    def __reduce__(self):  # keep the type and message across Ray's pickling
        return (type(self), self.args)


class ConfigError(RaytfError, ValueError):
    """A bad argument, config value or experiment file; raised before anything starts."""


class PlacementError(RaytfError):
    """The layout's resources can never be had on this cluster, or not within the timeout."""


class StartupTimeoutError(RaytfError, TimeoutError):
    """Actors or TensorFlow peers did not come up within the configured timeout."""


class WorkerError(RaytfError):
    """User code (model, data, loss) raised inside a worker actor.

    ``worker`` names the actor, ``error_type`` the original exception class and
    ``remote_traceback`` the traceback as it was printed in the actor.
    """

    def __init__(
        self,
        message: str,
        *,
        worker: str | None = None,
        error_type: str | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.worker = worker
        self.error_type = error_type
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return (
            _rebuild_worker_error,
            (self.args[0], self.worker, self.error_type, self.remote_traceback),
        )

    def __str__(self) -> str:
        text = self.args[0]
        if self.remote_traceback:
            text += "\n\nTraceback in the worker:\n" + self.remote_traceback.rstrip()
        return text


def _rebuild_worker_error(message, worker, error_type, remote_traceback) -> WorkerError:
    return WorkerError(
        message, worker=worker, error_type=error_type, remote_traceback=remote_traceback
    )


class Preempted(RaytfError):
    """A worker got SIGTERM (a spot instance reclaimed) and checkpointed before exiting.

    ``worker`` names the worker that got the signal, ``position`` is the step of the run
    (epochs x steps + step) the checkpoint holds, ``checkpoint`` its path (None if none was
    written, or on a worker that does not keep the checkpoint).
    """

    def __init__(
        self,
        message: str,
        checkpoint: str | None = None,
        position: int | None = None,
        worker: str | None = None,
    ) -> None:
        super().__init__(message, checkpoint, position, worker)
        self.checkpoint = checkpoint
        self.position = position
        self.worker = worker

    def __str__(self) -> str:
        return str(self.args[0])

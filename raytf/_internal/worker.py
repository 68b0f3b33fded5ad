"""The worker actor: a plain class, made remote by the coordinator with the layout's resources.

TensorFlow is imported when the actor starts (so that cost overlaps with the other actors'
start) but no op runs before the strategy exists: a multi-worker strategy must be the first
thing TensorFlow configures in a process.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from raytf.errors import RaytfError, WorkerError

F = TypeVar("F", bound=Callable[..., Any])

BIND_FAILURE = "Could not start gRPC server"


def as_worker_error(name: str, method: str, exc: Exception) -> WorkerError:
    """A user error raised in an actor, with its type and traceback, for the driver."""
    return WorkerError(
        f"{name} failed in {method}: {type(exc).__name__}: {exc}",
        worker=name,
        error_type=type(exc).__name__,
        remote_traceback=traceback.format_exc(),
    )


def surface_errors(method: F) -> F:
    """Turn any exception from user code into a WorkerError that carries its traceback."""

    @functools.wraps(method)
    def wrapper(self: TrainWorker, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except RaytfError:
            raise
        except Exception as exc:
            raise as_worker_error(self.name, method.__name__, exc) from None

    return wrapper  # type: ignore[return-value]


def actor_info(name: str) -> dict[str, Any]:
    """Where an actor runs and what Ray gave it: shown in results, used by fault tests."""
    import ray

    return {
        "name": name,
        "pid": os.getpid(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


class TrainWorker:
    """Hosts one TensorFlow worker: its devices, its strategy and a raytf Engine."""

    def __init__(self, name: str) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.environ.pop("TF_CONFIG", None)  # a leaked TF_CONFIG changes what strategies do
        self.name = name
        self._socket: socket.socket | None = None
        self._engine: Any = None
        self._training = False
        # Preemption (spot instances get SIGTERM): mid-epoch, checkpoint at the next step
        # boundary and report; idle, leave at once as the default handler would.
        signal.signal(signal.SIGTERM, self._on_sigterm)
        import tensorflow  # noqa: F401  (import only; no op may run yet)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._training and self._engine is not None:
            self._engine.preempted = True
        else:
            os._exit(128 + signum)

    def ready(self) -> dict[str, Any]:
        return actor_info(self.name)

    def reserve_address(self) -> str:
        """Bind a free port on this node and hold it until TensorFlow takes it over."""
        import ray

        ip = ray.util.get_node_ip_address()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("", 0))
        self._socket = sock
        return f"{ip}:{sock.getsockname()[1]}"

    @surface_errors
    def start_strategy(self, spec: Any) -> dict[str, Any]:
        """Set devices and build the strategy; for multi-worker this waits for every peer."""
        from raytf._internal import engine

        self.spec = spec
        self.devices, self.device_kind = engine.configure_devices(spec)
        if self._socket is not None:  # hand the port to TensorFlow as late as possible
            self._socket.close()
            self._socket = None
        self.strategy = engine.make_strategy(spec, self.devices)
        # MultiWorkerMirroredStrategy's coordination service installs its own SIGTERM
        # notifier, which would swallow the signal: raytf's handler goes back on top.
        signal.signal(signal.SIGTERM, self._on_sigterm)
        address = spec.cluster["worker"][spec.worker_index] if spec.cluster else None
        return {"devices": self.devices, "device_kind": self.device_kind, "address": address}

    @surface_errors
    def build(self, job: Any) -> dict[str, Any]:
        from raytf._internal.engine import Engine

        self._engine = Engine(self.spec, job, self.devices, self.strategy)
        return self._engine.build()

    @surface_errors
    def run_epoch(
        self,
        epoch: int,
        steps: int,
        validation_steps: int | None,
        start: int = 0,
        stop: int | None = None,
    ) -> dict[str, Any]:
        self._training = True
        try:
            return self._engine.run_epoch(epoch, steps, validation_steps, start, stop)
        finally:
            self._training = False

    @surface_errors
    def save(self, epoch: int, step: int) -> str | None:
        self._training = True  # a SIGTERM now waits for the write, not cuts it short
        try:
            return self._engine.save(epoch, step)
        finally:
            self._training = False

    @surface_errors
    def seek(self, batches: int) -> None:
        self._engine.seek(batches)

    @surface_errors
    def final(self, with_model: bool) -> dict[str, Any]:
        return self._engine.final(with_model)

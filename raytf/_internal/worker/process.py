"""What every raytf actor process does the same way, shared by composition.

Actor classes are plain classes made remote at spawn; each holds a :class:`Process` for its
name, the port it reserves for TensorFlow, and SIGTERM (a spot instance reclaimed): while
training, the signal is noted so the loop can checkpoint at the next step boundary;
otherwise the process leaves at once, as the default handler would.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import socket
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from raytf.errors import RaytfError, WorkerError

F = TypeVar("F", bound=Callable[..., Any])


def as_worker_error(name: str, method: str, exc: BaseException) -> WorkerError:
    """A user error raised in an actor, with its type and traceback, for the driver."""
    return WorkerError(
        f"{name} failed in {method}: {type(exc).__name__}: {exc}",
        worker=name,
        error_type=type(exc).__name__,
        remote_traceback=traceback.format_exc(),
    )


def surface_errors(method: F) -> F:
    """Any exception from user code becomes a WorkerError carrying its traceback (sync and
    async methods alike); the actor's ``name`` says where."""
    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def async_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return await method(self, *args, **kwargs)
            except RaytfError:
                raise
            except Exception as exc:
                raise as_worker_error(self.name, method.__name__, exc) from None

        return async_wrapper  # type: ignore[return-value]

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
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


class Process:
    """One actor process: quiet TensorFlow, no inherited TF_CONFIG, SIGTERM, a held port."""

    def __init__(self, name: str, handle_sigterm: bool = True) -> None:
        import ray

        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.environ.pop("TF_CONFIG", None)  # a leaked TF_CONFIG changes what strategies do
        if ray.is_initialized() and not ray.get_gpu_ids():
            # Ray 2.60 leaves CUDA_VISIBLE_DEVICES alone for actors without GPUs: TensorFlow
            # would take every GPU of the node, and most of its memory, from the actors that
            # were given them. Hidden before TensorFlow loads.
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        self.name = name
        self.training = False
        self.preempted = False
        self._socket: socket.socket | None = None
        if handle_sigterm:
            self.handle_sigterm()
        import tensorflow  # noqa: F401  (import only, overlapping the other actors' start)

    def handle_sigterm(self) -> None:
        """(Re)install raytf's handler: TensorFlow's coordination service installs its own."""
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.training:
            self.preempted = True
        else:
            os._exit(128 + signum)

    def info(self, **extra: Any) -> dict[str, Any]:
        return {**actor_info(self.name), **extra}

    def reserve_address(self) -> str:
        """Bind a free port on this node and hold it until TensorFlow takes it over."""
        import ray

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("", 0))
        self._socket = sock
        return f"{ray.util.get_node_ip_address()}:{sock.getsockname()[1]}"

    def release_address(self) -> None:
        """Hand the port to TensorFlow, as late as possible (another process may take it)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def guarded(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` as training: a SIGTERM now waits for the next step boundary."""
        self.training = True
        try:
            return fn()
        finally:
            self.training = False

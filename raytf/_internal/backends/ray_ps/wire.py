"""The parameter servers' data plane: pulls and pushes between workers and servers.

Two transports answer the same two calls, ``pull(worker, step)`` and ``push(worker, version,
flat, want, generation)``, each returning a :class:`Pending` whose ``result()`` is the
server's reply ``(version, flat values or None, epoch done)``:

- ``"tcp"`` (the default): one framed TCP stream per worker, server and direction, served on
  the server actor's own event loop next to its Ray methods. Why: through Ray's object store
  two workers' synchronous step (each pushing 1 MB and getting 1 MB of weights back) costs
  about 12 ms on one node (objects created, sealed, reference-counted and fetched, two actor
  calls each); the same bytes over sockets cost about 1.8 ms (``experiments/ps_wire.py``).
  Only pulls and pushes travel here; building, epochs, checkpoints and replacement stay Ray
  actor calls.
- ``"object-store"``: the same calls as Ray actor methods, for clusters whose nodes reach
  each other only on Ray's own ports.

A frame that arrives whole is the only thing a server acts on: a worker killed mid-push
leaves a half frame, which is dropped with its connection.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from typing import Any

import numpy as np

from raytf._internal.worker.process import as_worker_error
from raytf.errors import ConfigError, WorkerError

TCP, OBJECT_STORE = "tcp", "object-store"
TRANSPORTS = (TCP, OBJECT_STORE)

PULL, PUSH = 1, 2
OK, FAILED = 0, 1
# op, worker, step (pull; -1: now) or version (push), generation, want weights, payload bytes
REQUEST = struct.Struct("!BiqqBq")
# status, version, epoch done, payload bytes (float32 values, -1 for none, or a JSON error)
REPLY = struct.Struct("!BqBq")
CONNECT_TIMEOUT_S = 30.0
# Unacknowledged bytes older than this end the connection (a peer's node vanished mid-send);
# Linux would otherwise retransmit for about 15 minutes.
USER_TIMEOUT_MS = 30_000

Reply = tuple[int, Any, bool]


# ---------------------------------------------------------------------------------- server
class WireServer:
    """Serves a shard's pulls and pushes over TCP on the running event loop."""

    def __init__(self, protocol: Any, name: str) -> None:
        self.protocol, self.name = protocol, name
        self._listener: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen on this node's address (the one Ray gives the node); returns host:port."""
        import ray

        host = ray.util.get_node_ip_address()
        listener = socket.create_server((host, 0), backlog=128)
        listener.setblocking(False)
        self._listener = listener
        self._spawn(self._accept(listener))
        return f"{host}:{listener.getsockname()[1]}"

    def close(self) -> None:
        """Stop listening and drop every connection (handlers waiting on the old protocol
        end with them)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._tasks):
            task.cancel()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError:  # closed
                return
            conn.setblocking(False)
            _tune(conn)
            self._spawn(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        """One worker's stream. The socket API, not streams: a payload lands straight in its
        array and a reply leaves from the weights' own buffer, with no copy in Python."""
        loop = asyncio.get_running_loop()
        head = bytearray(REQUEST.size)
        try:
            while True:
                if not await _receive(loop, conn, head):
                    return  # the worker went away
                op, worker, at, generation, want, n = REQUEST.unpack(head)
                if n % 4:
                    return  # not a float32 payload: not a raytf worker
                flat = np.empty(n // 4, np.float32)  # new each time: a step may hold it
                if n and not await _receive(loop, conn, flat):
                    return  # a half-sent frame is never applied
                try:
                    if op == PULL:
                        reply = await self.protocol.pull(worker, None if at < 0 else at)
                    else:
                        reply = await self.protocol.push(worker, at, flat, bool(want), generation)
                except Exception as exc:  # the worker raises it, with this server's name
                    method = "pull" if op == PULL else "push"
                    await loop.sock_sendall(conn, _failure(self.name, method, exc))
                    continue
                version, values, done = reply
                size = -1 if values is None else values.nbytes
                await loop.sock_sendall(conn, REPLY.pack(OK, version, bool(done), size))
                if size > 0:
                    await loop.sock_sendall(conn, memoryview(values).cast("B"))
        except OSError:
            return  # the worker's end closed while a reply was on its way
        finally:
            conn.close()


async def _receive(loop: asyncio.AbstractEventLoop, conn: socket.socket, buffer: Any) -> bool:
    """Fill ``buffer`` from ``conn``; False if the peer closed first."""
    view = memoryview(buffer).cast("B")
    while view.nbytes:
        got = await loop.sock_recv_into(conn, view)
        if not got:
            return False
        view = view[got:]
    return True


def _failure(server: str, method: str, exc: BaseException) -> bytes:
    """An error frame: the WorkerError every raytf actor raises for a user error, as JSON."""
    error = as_worker_error(server, method, exc)
    fields = {"message": error.args[0], "error_type": error.error_type}
    body = json.dumps({**fields, "traceback": error.remote_traceback}).encode()
    return REPLY.pack(FAILED, 0, 0, len(body)) + body


def _tune(sock: socket.socket) -> None:
    """No Nagle delay on small frames; a vanished peer node shows within about 30 s, whether
    the connection is idle (keepalive) or has bytes in flight (user timeout)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = (
        ("TCP_KEEPIDLE", 10),
        ("TCP_KEEPINTVL", 5),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    )
    for option, value in options:
        if hasattr(socket, option):  # Linux; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


# ---------------------------------------------------------------------------------- client
class Pending:
    """A reply on its way; ``result()`` waits for it (once)."""

    def __init__(self, read: Any) -> None:
        self._read, self._value = read, None

    def result(self) -> Reply:
        if self._read is not None:
            self._value, self._read = self._read(), None
        return self._value  # type: ignore[return-value]


class _Stream:
    """One blocking TCP stream to a server: a request out, its reply back, in order."""

    def __init__(self, address: str, server: str, worker: str) -> None:
        self.address, self.server, self.worker = address, server, worker
        host, port = address.rsplit(":", 1)
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise _unreachable(server, address, worker, exc) from None
        self.sock.settimeout(None)  # a synchronous step may wait for a straggler; Ray times it
        _tune(self.sock)
        self._head = bytearray(REPLY.size)
        self._values = np.empty(0, np.float32)  # reused: valid until the next reply
        self._broken: BaseException | None = None

    def send(self, head: bytes, payload: Any = None) -> None:
        if self._broken is not None:  # a reply may be unread: the stream is out of step
            raise self._broken
        try:
            self.sock.sendall(head)
            if payload is not None:
                self.sock.sendall(memoryview(payload).cast("B"))
        except OSError as exc:
            raise self._fail(self._lost(exc)) from None

    def receive(self) -> Reply:
        if self._broken is not None:
            raise self._broken
        try:
            self._fill(self._head)
            status, version, done, n = REPLY.unpack(self._head)
            if status != OK:
                body = bytearray(n)
                self._fill(body)
                raise _remote_error(self.server, json.loads(body))
            if n < 0:
                return version, None, bool(done)
            if self._values.nbytes != n:
                self._values = np.empty(n // 4, np.float32)
            self._fill(self._values)
            return version, self._values, bool(done)
        except OSError as exc:
            raise self._fail(self._lost(exc)) from None
        except WorkerError:
            raise  # the server's own error, read whole: the stream is still in step
        except BaseException as exc:
            raise self._fail(exc) from None

    def _fail(self, exc: BaseException) -> BaseException:
        """Any failure ends the stream: nothing later may read a reply meant for another."""
        self._broken = exc
        self.sock.close()
        return exc

    def _fill(self, buffer: Any) -> None:
        view = memoryview(buffer).cast("B")
        while view.nbytes:
            got = self.sock.recv_into(view)
            if not got:
                raise ConnectionResetError("the server closed the connection")
            view = view[got:]

    def _lost(self, exc: BaseException) -> WorkerError:
        # A lost server is a lost actor: the failure policy restarts from its checkpoint.
        return WorkerError(
            f"{self.worker}: parameter server {self.server} died (lost its connection at "
            f"{self.address}: {exc})",
            worker=self.worker,
            error_type="RayActorError",
        )

    def close(self) -> None:
        self.sock.close()


def _unreachable(server: str, address: str, worker: str, cause: BaseException) -> ConfigError:
    return ConfigError(
        f"{worker} could not connect to parameter server {server} at {address} within "
        f"{CONNECT_TIMEOUT_S:g} s ({cause}). The nodes must reach each other on any TCP port for "
        "transport='tcp' (a firewall or security group may block it): open the ports between "
        "nodes, or use ParameterServer(transport='object-store'), which needs only Ray's ports."
    )


def _remote_error(server: str, error: dict[str, Any]) -> WorkerError:
    return WorkerError(
        error["message"],
        worker=server,
        error_type=error["error_type"],
        remote_traceback=error["traceback"],
    )


class TcpChannel:
    """A worker's link to one server: pulls and pushes on separate streams, so a prefetched
    pull never queues behind a push (two Ray calls would not either)."""

    def __init__(self, address: str, server: str, worker: str) -> None:
        self._pulls = _Stream(address, server, worker)
        try:
            self._pushes = _Stream(address, server, worker)
        except BaseException:
            self._pulls.close()
            raise

    def pull(self, worker: int, step: int | None) -> Pending:
        stream = self._pulls
        stream.send(REQUEST.pack(PULL, worker, -1 if step is None else step, 0, 0, 0))
        return Pending(stream.receive)

    def push(
        self, worker: int, version: int, flat: np.ndarray, want: bool, generation: int
    ) -> Pending:
        stream = self._pushes
        stream.send(REQUEST.pack(PUSH, worker, version, generation, want, flat.nbytes), flat)
        return Pending(stream.receive)

    def close(self) -> None:
        self._pulls.close()
        self._pushes.close()


class RayChannel:
    """The same calls as Ray actor methods: data through the object store."""

    def __init__(self, actor: Any, server: str, worker: str) -> None:
        self.actor, self.server, self.worker = actor, server, worker

    def pull(self, worker: int, step: int | None) -> Pending:
        ref = self.actor.pull.remote(worker, step)
        return Pending(lambda: self._get(ref))

    def push(
        self, worker: int, version: int, flat: np.ndarray, want: bool, generation: int
    ) -> Pending:
        ref = self.actor.push.remote(worker, version, flat, want, generation)
        return Pending(lambda: self._get(ref))

    def _get(self, ref: Any) -> Reply:
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise WorkerError(
                f"{self.worker}: parameter server {self.server} died: {exc}",
                worker=self.worker,
                error_type=type(exc).__name__,
            ) from None

    def close(self) -> None:
        pass


def open_channels(
    transport: str, actors: list[Any], names: list[str], addresses: list[str | None], worker: str
) -> list[Any]:
    """One channel per server, in server order."""
    if transport != TCP:
        return [RayChannel(a, n, worker) for a, n in zip(actors, names)]
    channels: list[Any] = []
    try:
        for actor, name, address in zip(actors, names, addresses):
            try:
                channels.append(TcpChannel(address, name, worker))  # type: ignore[arg-type]
            except ConfigError as unreachable:
                raise _dead(actor, name, worker) or unreachable from None
    except BaseException:
        for channel in channels:
            channel.close()
        raise
    return channels


def _dead(actor: Any, server: str, worker: str) -> WorkerError | None:
    """A server that cannot be reached because its process died: a lost actor (recoverable),
    not a network problem. None when Ray says it is alive."""
    import ray

    try:
        ray.get(actor.ready.remote(), timeout=CONNECT_TIMEOUT_S)
    except ray.exceptions.RayActorError as exc:
        return WorkerError(
            f"{worker}: parameter server {server} died: {exc}",
            worker=worker,
            error_type=type(exc).__name__,
        )
    except Exception:  # alive but slow to answer: the connect error stands
        return None
    return None

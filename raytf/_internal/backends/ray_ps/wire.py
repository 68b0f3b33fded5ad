"""The parameter servers' data plane: pulls and pushes between workers and servers.

Two transports answer the same two calls, ``pull(worker, step)`` and ``push(worker, version,
flat, want, generation)``, each returning a :class:`Pending` whose ``result()`` is the
server's reply ``(version, flat values or None, epoch done)``:

- ``"tcp"`` (the default): one framed TCP stream per worker, server and direction, served on
  the server actor's own event loop next to its Ray methods. Why: through Ray's object store
  a synchronous step's 1 MB push plus the 1 MB of weights back cost about 11 ms on one node
  (two objects created, sealed, reference-counted and fetched, two actor calls); the same
  bytes over a socket cost about 3 ms (``experiments/ps_wire.py``). Only pulls and pushes
  travel here; building, epochs, checkpoints and replacement stay Ray actor calls.
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
import traceback
from typing import Any

import numpy as np

from raytf.errors import ConfigError, WorkerError

TCP, OBJECT_STORE = "tcp", "object-store"
TRANSPORTS = (TCP, OBJECT_STORE)

PULL, PUSH = 1, 2
OK, FAILED = 0, 1
# op, worker, step (pull; -1: now) or version (push), generation, want weights, payload bytes
REQUEST = struct.Struct("!BiqqBq")
# status, version, epoch done, payload bytes (float32 values, or a JSON error)
REPLY = struct.Struct("!BqBq")
CONNECT_TIMEOUT_S = 30.0
# A stream reader this large takes a whole 1 MB frame without pausing the transport.
READ_LIMIT = 1 << 24

Reply = tuple[int, Any, bool]


# ---------------------------------------------------------------------------------- server
class WireServer:
    """Serves a shard's pulls and pushes over TCP on the running event loop."""

    def __init__(self, protocol: Any, name: str) -> None:
        self.protocol, self.name = protocol, name
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        """Listen on this node's address (the one Ray gives the node); returns host:port."""
        import ray

        host = ray.util.get_node_ip_address()
        self._server = await asyncio.start_server(self._serve, host, 0, limit=READ_LIMIT)
        port = self._server.sockets[0].getsockname()[1]
        return f"{host}:{port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _tune(writer.get_extra_info("socket"))
        try:
            while True:
                try:
                    head = await reader.readexactly(REQUEST.size)
                    op, worker, at, generation, want, n = REQUEST.unpack(head)
                    payload = await reader.readexactly(n) if n else b""
                except (asyncio.IncompleteReadError, ConnectionError):
                    return  # the worker went away; a half-sent frame is never applied
                try:
                    if op == PULL:
                        reply = await self.protocol.pull(worker, None if at < 0 else at)
                    else:
                        flat = np.frombuffer(payload, np.float32)
                        reply = await self.protocol.push(worker, at, flat, bool(want), generation)
                except Exception as exc:  # the worker raises it, with this server's name
                    writer.write(_failure(self.name, "pull" if op == PULL else "push", exc))
                else:
                    version, values, done = reply
                    size = 0 if values is None else values.nbytes
                    writer.write(REPLY.pack(OK, version, bool(done), size))
                    if size:
                        writer.write(memoryview(values).cast("B"))
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()


def _failure(server: str, method: str, exc: BaseException) -> bytes:
    body = json.dumps(
        {
            "message": f"{server} failed in {method}: {type(exc).__name__}: {exc}",
            "error_type": type(exc).__name__,
            "traceback": traceback.format_exc(),
        }
    ).encode()
    return REPLY.pack(FAILED, 0, 0, len(body)) + body


def _tune(sock: socket.socket | None) -> None:
    """No Nagle delay on small frames; keepalive so a vanished node shows within ~30 s."""
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
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
            raise ConfigError(
                f"{worker} could not connect to parameter server {server} at {address} "
                f"within {CONNECT_TIMEOUT_S:g} s ({exc}). The nodes must reach each other "
                "on any TCP port for transport='tcp' (a firewall or security group may block "
                "it): open the ports between nodes, or use "
                "ParameterServer(transport='object-store'), which needs only Ray's ports."
            ) from None
        self.sock.settimeout(None)  # a synchronous step may wait for a straggler; Ray times it
        _tune(self.sock)
        self._head = bytearray(REPLY.size)
        self._values = np.empty(0, np.float32)  # reused: valid until the next reply

    def send(self, head: bytes, payload: Any = None) -> None:
        try:
            self.sock.sendall(head)
            if payload is not None:
                self.sock.sendall(memoryview(payload).cast("B"))
        except OSError as exc:
            raise self._lost(exc) from None

    def receive(self) -> Reply:
        try:
            self._fill(self._head)
            status, version, done, n = REPLY.unpack(self._head)
            if status != OK:
                body = bytearray(n)
                self._fill(body)
                raise _remote_error(self.server, json.loads(body))
            if not n:
                return version, None, bool(done)
            if self._values.nbytes != n:
                self._values = np.empty(n // 4, np.float32)
            self._fill(self._values)
            return version, self._values, bool(done)
        except OSError as exc:
            raise self._lost(exc) from None

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
        self._pushes = _Stream(address, server, worker)

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
    if transport == TCP:
        return [TcpChannel(a, n, worker) for a, n in zip(addresses, names)]  # type: ignore[arg-type]
    return [RayChannel(a, n, worker) for a, n in zip(actors, names)]

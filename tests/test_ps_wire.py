"""The parameter servers' TCP data plane on real sockets: the real ShardProtocol served by the
real WireServer on an event loop thread, real TcpChannels as workers. No Ray, no TensorFlow:
what is under test is framing, errors and lost connections."""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import raytf
from raytf._internal.backends.ray_ps.protocol import ShardProtocol
from raytf._internal.backends.ray_ps.wire import PUSH, REQUEST, TcpChannel, WireServer
from raytf._internal.runtime.group import recoverable


@pytest.fixture
def serve():
    """``serve(protocol) -> address``: a WireServer on its own event loop thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = []

    def start(protocol, name="ps-0"):
        wire = WireServer(protocol, name)
        servers.append(wire)
        return asyncio.run_coroutine_threadsafe(wire.start(), loop).result(timeout=10)

    yield start

    async def stop():
        for wire in servers:
            wire.close()
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def shard(workers, staleness=0, apply=None):
    applied = []
    protocol = ShardProtocol(
        workers,
        staleness,
        0,
        apply=apply or (lambda flat: applied.append(np.array(flat))),
        values=lambda: np.full(3, float(protocol.version), np.float32),
    )
    protocol.applied = applied
    return protocol


def test_a_synchronous_step_over_tcp_applies_the_mean_once_and_answers_with_new_weights(serve):
    protocol = shard(workers=2)
    address = serve(protocol)
    channels = [TcpChannel(address, "ps-0", f"worker-{i}") for i in range(2)]

    def push(i):
        grad = np.full(3, 1.0 + 2 * i, np.float32)  # 1 and 3: their mean is 2
        return channels[i].push(i, 0, grad, True, 0).result()

    with ThreadPoolExecutor(2) as pool:  # the step closes only when both have pushed
        replies = list(pool.map(push, range(2)))
    assert [r[0] for r in replies] == [1, 1]
    for _, values, done in replies:
        np.testing.assert_array_equal(values, np.full(3, 1.0, np.float32))  # version 1
        assert done is False
    (mean,) = protocol.applied
    np.testing.assert_array_equal(mean, np.full(3, 2.0, np.float32))
    version, values, _ = channels[0].pull(0, None).result()
    assert version == 1 and values.tolist() == [1.0, 1.0, 1.0]
    assert protocol.stats["bytes_in"] == 2 * 12 and protocol.stats["pushes"] == 2


def test_a_half_sent_push_is_never_applied(serve):
    protocol = shard(workers=1, staleness=None)  # asynchronous: a whole push applies at once
    address = serve(protocol)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        # A worker killed mid-push: the header promises 12 bytes, 4 arrive, the socket closes.
        raw.sendall(REQUEST.pack(PUSH, 0, 0, 0, 0, 12) + b"\x00" * 4)
    channel = TcpChannel(address, "ps-0", "worker-0")
    version, _, _ = channel.push(0, 0, np.full(3, 5.0, np.float32), False, 0).result()
    assert version == 1
    (only,) = protocol.applied  # the whole push, and nothing of the half one
    assert only.tolist() == [5.0, 5.0, 5.0]
    assert protocol.stats["pushes"] == 1


def test_an_error_on_the_server_reaches_the_worker_with_its_message(serve):
    def apply(flat):
        raise ValueError(f"cannot apply {flat.size} values")

    address = serve(shard(workers=1, staleness=None, apply=apply), name="ps-3")
    channel = TcpChannel(address, "ps-3", "worker-0")
    pending = channel.push(0, 0, np.ones(7, np.float32), True, 0)
    with pytest.raises(raytf.WorkerError, match=r"ps-3 failed in push: ValueError: cannot apply 7"):
        pending.result()
    # A bug, not a lost process: the failure policy does not retry it.
    with pytest.raises(raytf.WorkerError) as info:
        channel.push(0, 0, np.ones(7, np.float32), True, 0).result()
    assert info.value.worker == "ps-3" and not recoverable(info.value)
    assert "Traceback" in info.value.remote_traceback


def test_a_server_that_goes_away_is_a_lost_actor_the_policy_recovers_from():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept_then_die():  # a server process killed with its connections open
        for _ in range(2):  # the channel's pull and push streams
            conn, _ = listener.accept()
            conn.close()

    killer = threading.Thread(target=accept_then_die)
    killer.start()
    channel = TcpChannel(f"127.0.0.1:{port}", "ps-0", "worker-1")
    killer.join(timeout=10)
    with pytest.raises(raytf.WorkerError, match=r"worker-1: parameter server ps-0 died") as info:
        channel.pull(1, None).result()
    assert recoverable(info.value)
    listener.close()


def test_an_unreachable_server_is_a_clear_configuration_error():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # free now, and nobody listens once closed
    with pytest.raises(raytf.ConfigError, match=r"could not connect.*transport='object-store'"):
        TcpChannel(f"127.0.0.1:{port}", "ps-0", "worker-0")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"transport": "udp"}, r"unknown transport 'udp'; choose 'tcp'"),
        (
            {"transport": "object-store", "backend": "tensorflow", "staleness": None},
            r"backend='tensorflow' always uses TensorFlow's gRPC",
        ),
    ],
)
def test_transport_options_are_checked(options, message):
    with pytest.raises(raytf.ConfigError, match=message):
        raytf.ParameterServer(**options)

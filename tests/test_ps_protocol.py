"""The parameter server's consistency rules, step by step: pure asyncio, no Ray, no TF.

The real ShardProtocol with recorders for its two TensorFlow functions, so each test can
script an exact interleaving of pushes and pulls and check who waits, what is applied, and what
is dropped.
"""

from __future__ import annotations

import asyncio

import numpy as np

from raytf._internal.backends.ray_ps.protocol import ShardProtocol


def shard(workers, staleness=0, backup=0):
    """A real protocol whose apply records what it is given and whose values are the version."""
    applied = []
    s = ShardProtocol(
        workers,
        staleness,
        backup,
        apply=lambda flat: applied.append(np.asarray(flat).copy()),
        values=lambda: np.array([float(s.version)], dtype=np.float32),
    )
    s.applied = applied
    return s


def g(value):
    return np.array([value], dtype=np.float32)


async def settle():
    """Let every runnable task run until it finishes or blocks (yields, not a timer)."""
    for _ in range(20):
        await asyncio.sleep(0)


def run(coro):
    return asyncio.run(coro)


def test_synchronous_step_waits_for_every_worker_and_applies_the_mean():
    async def scenario():
        s = shard(2)
        await s.start_epoch(steps=1)
        first = asyncio.create_task(s.push(0, 0, g(1.0), True))
        await settle()
        assert not first.done() and s.applied == []  # worker 0 waits for worker 1
        second = await s.push(1, 0, g(3.0), True)
        version, _, done = await first
        assert (version, done) == (1, True) and second[0] == 1
        np.testing.assert_array_equal(s.applied, [g(2.0)])

    run(scenario())


def test_backup_worker_closes_on_the_first_gradients_and_drops_the_late_one():
    async def scenario():
        s = shard(3, backup=1)
        await s.start_epoch(steps=5)
        a = asyncio.create_task(s.push(0, 0, g(1.0), True))
        b = asyncio.create_task(s.push(1, 0, g(3.0), True))
        await settle()
        assert a.done() and b.done() and len(s.applied) == 1  # closed on 2 of 3
        late = await s.push(2, 0, g(100.0), True)  # computed on version 0, now 1
        assert late[0] == 1 and s.stats["dropped"] == 1 and len(s.applied) == 1
        np.testing.assert_array_equal(s.applied[0], g(2.0))

    run(scenario())


def test_a_step_closes_once_every_worker_answered_even_below_quorum():
    # The cross-server case: one worker's push was dropped here (it is busy on another
    # server), another's is pending; once the third answers, the step must not wait on.
    async def scenario():
        s = shard(3, backup=1)
        await s.start_epoch(steps=5)
        s.version = 4  # as after earlier steps
        pending = asyncio.create_task(s.push(1, 4, g(2.0), True))
        await s.push(2, 3, g(9.0), True)  # late: dropped, but it answered
        await settle()
        assert not pending.done()  # 1 gradient < quorum 2, worker 0 not heard from
        await s.push(0, 3, g(9.0), True)  # worker 0 late too: everyone answered
        await settle()
        assert pending.done() and s.version == 5
        np.testing.assert_array_equal(s.applied[-1], g(2.0))

    run(scenario())


def test_the_epoch_ends_on_the_servers_and_late_pushes_are_dropped():
    async def scenario():
        s = shard(2, backup=1)
        await s.start_epoch(steps=2)
        assert (await s.push(0, 0, g(1.0), True))[2] is False
        assert (await s.push(0, 1, g(1.0), True))[2] is True  # 2 steps: the epoch is over
        straggler = await s.push(1, 0, g(5.0), True)
        assert straggler[2] is True and s.stats["dropped"] == 1 and len(s.applied) == 2
        await s.start_epoch(steps=2)
        assert (await s.pull(1, None))[2] is False

    run(scenario())


def test_bounded_staleness_holds_the_fast_worker_k_steps_ahead():
    async def scenario():
        s = shard(2, staleness=1)
        await s.start_epoch(steps=100)
        for step in range(2):  # worker 0 pushes steps 0 and 1; worker 1 pushed nothing
            await s.push(0, step, g(1.0), False)
        ahead = asyncio.create_task(s.pull(0, 2))  # step 2 needs worker 1 at >= 1
        await settle()
        assert not ahead.done()
        await s.push(1, 0, g(1.0), False)
        await settle()
        assert ahead.done()
        assert max(s.gap_hist) <= 1 and s.stats["wait_seconds"] > 0

    run(scenario())


def test_the_end_of_an_epoch_releases_a_worker_waiting_on_the_bound():
    async def scenario():
        s = shard(2, staleness=1)
        await s.start_epoch(steps=1)  # 2 worker batches in all
        await s.push(0, 0, g(1.0), False)
        blocked = asyncio.create_task(s.pull(0, 2))
        await settle()
        assert not blocked.done()
        await s.push(0, 1, g(1.0), False)  # the second batch ends the epoch
        await settle()
        assert blocked.done() and blocked.result()[2] is True

    run(scenario())


def test_asynchronous_updates_record_how_stale_each_gradient_was():
    async def scenario():
        s = shard(2, staleness=None)
        await s.start_epoch(steps=10)
        v0 = (await s.pull(0, 0))[0]
        await s.push(1, 0, g(1.0), False)
        await s.push(1, 1, g(1.0), False)
        await s.push(0, v0, g(1.0), False)  # computed on version 0, applied at version 2
        assert s.staleness_hist == {0: 2, 2: 1} and s.version == 3

    run(scenario())


def test_a_dead_workers_gradient_in_an_open_step_is_dropped_and_its_batch_redone():
    async def scenario():
        s = shard(3)
        await s.start_epoch(steps=2)
        w0 = asyncio.create_task(s.push(0, 0, g(1.0), True))
        dead = asyncio.create_task(s.push(1, 0, g(100.0), True))  # then its process dies
        await settle()
        assert s.version == 0 and s.clock[1] == 1  # waiting for worker 2
        assert await s.forget(1) == 0  # dropped: the replacement computes batch 0 again
        generation = await s.rejoin(1, 0)
        # A push of the old incarnation still in flight is refused, never applied.
        _, values, _ = await s.push(1, 0, g(100.0), True, generation - 1)
        assert values is None and s.applied == [] and s.clock[1] == 0
        replacement = asyncio.create_task(s.push(1, 0, g(3.0), True, generation))
        await s.push(2, 0, g(5.0), True)
        assert [(await t)[0] for t in (w0, replacement)] == [1, 1]
        np.testing.assert_array_equal(s.applied, [g(3.0)])  # (1 + 3 + 5) / 3: no 100
        assert s.clock == {0: 1, 1: 1, 2: 1}
        dead.cancel()

    run(scenario())


def test_a_replacement_rejoining_at_its_clock_releases_workers_held_at_the_bound():
    async def scenario():
        s = shard(2, staleness=1)
        await s.start_epoch(steps=10)
        for step in range(2):
            await s.push(0, step, g(1.0), False)
        held = asyncio.create_task(s.pull(0, 2))  # worker 1 has pushed 0 steps: hold
        await settle()
        assert not held.done()
        await s.forget(1)
        await s.rejoin(1, 1)  # one of its pushes reached another server: count it here too
        version, _, _ = await held
        assert version == 2 and s.clock == {0: 2, 1: 1}

    run(scenario())


def test_a_step_the_dead_worker_pushed_only_elsewhere_closes_without_it():
    async def scenario():
        s = shard(2)  # this server never got worker 1's push of step 0; another did
        await s.start_epoch(steps=4)
        w0 = asyncio.create_task(s.push(0, 0, g(1.0), True))
        await settle()
        assert await s.forget(1) == 0
        await s.rejoin(1, 1)  # the replacement goes on at batch 1
        version, _, _ = await w0
        assert version == 1 and s.clock == {0: 1, 1: 1}
        np.testing.assert_array_equal(s.applied, [g(1.0)])  # worker 0's alone

    run(scenario())


def test_an_update_the_server_refuses_is_dropped_without_a_new_version():
    """Mixed precision: an asynchronous push that overflowed at a larger loss scale than the
    server's now is refused by the server's apply; it counts as dropped, not applied."""

    async def scenario():
        s = shard(2, staleness=None)
        refused = s._apply
        s._apply = lambda flat: False if flat[0] < 0 else refused(flat)
        await s.start_epoch(steps=2)
        await s.push(0, 0, g(-1.0), False)  # refused
        await s.push(1, 0, g(2.0), False)  # applied
        assert (s.version, s.stats["applied"], s.stats["dropped"]) == (1, 1, 1)
        np.testing.assert_array_equal(s.applied, [g(2.0)])

    run(scenario())

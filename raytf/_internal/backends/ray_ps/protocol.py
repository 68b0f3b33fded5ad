"""A parameter server's consistency rules, as a state machine over asyncio: no Ray, no TF.

The server actor hands it two functions, ``apply(flat)`` (one update of its variables; it
returns False to refuse one, e.g. a stale overflow under mixed precision) and ``values()``
(its variables as one flat buffer), and forwards every push, pull and epoch call here.
Waits (a synchronous step's barrier, the staleness bound) are ``asyncio`` waits that hold no
thread, so one event loop serialises every update.

An epoch ends on the servers, not on each worker: ``start_epoch`` sets a target version (the
epoch's synchronous steps, or every worker batch of it when updates are applied one by one),
and every reply says whether it is reached, so fast workers are not held to the pace of a
straggler's own share. Rules:
- synchronous (staleness 0): a step closes when ``workers - backup`` gradients computed on the
  current version have arrived, or when every worker has answered the step (a late push,
  computed on an older version, answers but is dropped, never applied); their mean is applied
  once.
- bounded staleness k: each gradient is applied on arrival; a worker's pull for its step t
  waits until every worker has pushed t - k steps, so none is more than k steps ahead of the
  slowest.
- asynchronous: each gradient is applied on arrival; nothing waits.
Every wait also ends when the epoch does, so nobody waits for a worker that has stopped.

A worker that dies is replaced in place (``forget``, then ``rejoin``): its gradient waiting in
an open synchronous step is dropped, and pushes from its old incarnation that are still in
flight are refused by generation, so nothing it sent is applied twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

Reply = tuple[int, Any, bool]  # (version, flat values or None, epoch done)


class ShardProtocol:
    """One shard's clock, pending step, staleness bound and epoch target."""

    def __init__(
        self,
        workers: int,
        staleness: int | None,
        backup_workers: int,
        apply: Callable[[Any], bool | None],
        values: Callable[[], Any],
        version: int = 0,
    ) -> None:
        self.workers = workers
        self.staleness = staleness
        self.quorum = workers - backup_workers
        self._apply, self._flat_values = apply, values
        self.version = version
        self.clock = dict.fromkeys(range(workers), 0)  # steps each worker has pushed
        self.generation = dict.fromkeys(range(workers), 0)  # incarnation, bumped on replace
        self.pending: list[tuple[int, Any]] = []
        self.answered: set[int] = set()  # workers heard from in the open synchronous step
        self.epoch_target: int | None = None
        self.cond = asyncio.Condition()
        self._snapshot_at: int | None = None
        self._snapshot: Any = None
        self.stats: dict[str, Any] = {
            "pushes": 0,
            "applied": 0,
            "dropped": 0,
            "pulls": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "apply_seconds": 0.0,
            "wait_seconds": 0.0,
        }
        self.staleness_hist: Counter[int] = Counter()
        self.gap_hist: Counter[int] = Counter()

    # ------------------------------------------------------------------ epochs
    async def start_epoch(self, steps: int) -> None:
        """Open an epoch, or a segment of one, of ``steps`` global steps (x workers when
        applied one by one)."""
        async with self.cond:
            per_update = 1 if self.staleness == 0 else self.workers
            self.epoch_target = self.version + steps * per_update
            self.answered = set()
            self.cond.notify_all()

    def done(self) -> bool:
        return self.epoch_target is not None and self.version >= self.epoch_target

    # ------------------------------------------------------------------ traffic
    async def pull(self, worker: int, step: int | None) -> Reply:
        """(version, values, epoch done) for the worker's ``step`` (None: now, no wait)."""
        if step is not None:
            await self._wait_for_bound(step)
        return self.version, self._values(), self.done()

    async def push(
        self, worker: int, version: int, flat: Any, want_weights: bool, generation: int = 0
    ) -> Reply:
        """The flat gradients (and non-trainable values) of ``worker``, computed on
        ``version`` of this shard. Returns (version, values, epoch done); values are the
        weights for the worker's next step when ``want_weights`` (saving it a round trip)."""
        self.stats["pushes"] += 1
        self.stats["bytes_in"] += flat.nbytes
        t0 = time.perf_counter()
        async with self.cond:
            # Checked under the lock: a ``forget`` queued ahead of this push has run.
            if generation != self.generation[worker]:  # sent by a worker since replaced
                self.stats["dropped"] += 1
                return self.version, None, self.done()
            # A batch consumed, applied or not: the staleness clock, and where a
            # replacement for this worker would go on.
            self.clock[worker] += 1
            if self.staleness != 0:
                if self.done():  # the epoch closed while this gradient was in flight
                    self.stats["dropped"] += 1
                else:
                    self.staleness_hist[self.version - version] += 1
                    self._apply_one(flat)
                self.cond.notify_all()
            elif self.done():
                self.stats["dropped"] += 1
            else:
                if version < self.version:  # the step closed without it: late, dropped
                    self.stats["dropped"] += 1
                else:
                    self.pending.append((worker, flat))
                self.answered.add(worker)
                self._maybe_close()
                await self.cond.wait_for(lambda: self.version > version)
                self.stats["wait_seconds"] += time.perf_counter() - t0
        if not want_weights:
            return self.version, None, self.done()
        return await self.pull(worker, None if self.staleness == 0 else self.clock[worker])

    async def forget(self, worker: int) -> int:
        """``worker`` died: refuse its old pushes, drop its gradient from the open step.

        Returns the batches of its data that count as consumed here: where a replacement
        must go on (a dropped gradient's batch is computed again).
        """
        async with self.cond:
            self.generation[worker] += 1
            mine = [p for p in self.pending if p[0] == worker]
            self.pending = [p for p in self.pending if p[0] != worker]
            self.answered.discard(worker)
            self.stats["dropped"] += len(mine)
            self.clock[worker] -= len(mine)
            return self.clock[worker]

    async def rejoin(self, worker: int, clock: int) -> int:
        """A replacement for ``worker`` starts at ``clock`` batches; returns its generation.

        Servers may disagree by one push (the old process died between them): all take the
        replacement's count, so the staleness bound measures the same steps everywhere, and
        a synchronous server that missed the push closes that step without it.
        """
        async with self.cond:
            if self.staleness == 0 and self.clock[worker] < clock and not self.done():
                # The old process pushed this step to another server, not here: its share
                # of the open step is lost, and the step closes on the other workers'.
                self.answered.add(worker)
                self._maybe_close()
            self.clock[worker] = clock
            self.cond.notify_all()
            return self.generation[worker]

    def _maybe_close(self) -> None:
        """Close the synchronous step if enough gradients are in (caller holds the lock)."""
        if not self.pending:
            return
        if len(self.pending) < self.quorum and len(self.answered) < self.workers:
            return
        n = len(self.pending)
        self.staleness_hist[0] += n
        # Mean of the gradients (and of the non-trainable values) the step accepted.
        self._apply_one(_mean([flat for _, flat in self.pending], n))
        self.pending = []
        self.answered = set()
        self.cond.notify_all()

    def _apply_one(self, flat: Any) -> None:
        """One update; ``apply`` may refuse it (False): counted as dropped, no new version."""
        t0 = time.perf_counter()
        if self._apply(flat) is False:
            self.stats["dropped"] += 1
            return
        self.version += 1
        self.stats["applied"] += 1
        self.stats["apply_seconds"] += time.perf_counter() - t0

    async def _wait_for_bound(self, step: int) -> None:
        """Bounded staleness: a worker starts step t once every worker has pushed t - k."""
        if self.staleness:  # 0 (sync) waits in push; None (async) never waits
            k = self.staleness
            t0 = time.perf_counter()
            async with self.cond:
                await self.cond.wait_for(
                    lambda: min(self.clock.values()) >= step - k or self.done()
                )
            self.stats["wait_seconds"] += time.perf_counter() - t0
        if self.staleness != 0 and not self.done():
            self.gap_hist[max(0, step - min(self.clock.values()))] += 1

    def _values(self) -> Any:
        """This shard's values as one flat buffer, copied out of TensorFlow once per version."""
        if self._snapshot_at != self.version:
            self._snapshot = self._flat_values()
            self._snapshot_at = self.version
        self.stats["pulls"] += 1
        self.stats["bytes_out"] += self._snapshot.nbytes
        return self._snapshot

    def report(self) -> dict[str, Any]:
        """Load and staleness measured on this shard."""
        return {
            "version": self.version,
            **self.stats,
            "staleness": dict(self.staleness_hist),
            "steps_ahead": dict(self.gap_hist),
        }


def _mean(arrays: list[Any], n: int) -> Any:
    total = arrays[0].copy()
    for a in arrays[1:]:
        total += a
    total /= n
    return total

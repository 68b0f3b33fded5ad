"""A parameter-server shard: an async Ray actor owning some variables and their optimizer state.

Workers pull weights and push gradients. The shard applies them with the model's own Keras
optimizer, so optimizer state (Adam's moments, the iteration count behind learning-rate
schedules) lives with the variables. One event loop serialises every update; waits
(a synchronous step's barrier, the staleness bound) are ``asyncio`` waits that hold no thread.

An epoch ends on the servers, not on each worker: ``start_epoch`` sets a target version (the
epoch's synchronous steps, or every worker batch of it when updates are applied one by one),
and every reply says whether it is reached, so fast workers are not held to the pace of a
straggler's own share. Consistency rules, per shard:
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
flight are refused by generation, so nothing it sent is applied twice. The others keep
training, or wait at the barrier or the bound until the replacement catches up.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from raytf._internal.worker import actor_info, as_worker_error
from raytf.errors import ConfigError, RaytfError

F = TypeVar("F", bound=Callable[..., Any])


def surface_async_errors(method: F) -> F:
    """The async twin of worker.surface_errors: user errors arrive with their traceback."""

    @functools.wraps(method)
    async def wrapper(self: ParameterShard, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except RaytfError:
            raise
        except Exception as exc:
            raise as_worker_error(self.name, method.__name__, exc) from None

    return wrapper  # type: ignore[return-value]


class ParameterShard:
    """One parameter server. A plain class: the coordinator makes it a Ray actor at spawn."""

    def __init__(self, name: str, index: int) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.environ.pop("TF_CONFIG", None)
        self.name = name
        self.index = index
        import tensorflow  # noqa: F401  (overlaps TF's import with the other actors' start)

    async def ready(self) -> dict[str, Any]:
        return {**actor_info(self.name), "role": "ps"}

    # ------------------------------------------------------------------ setup
    @surface_async_errors
    async def build(
        self, job: Any, variables: list[dict[str, Any]], config: dict[str, Any]
    ) -> dict[str, Any]:
        """Own ``variables`` (initial values from worker 0), with the model's optimizer.

        ``config``: workers, staleness (None = async), backup_workers, checkpoint_dir, resume.
        Returns the epoch to start from (after a restore) and the bytes held.
        """
        import keras
        import tensorflow as tf

        from raytf._internal.engine import build_compiled_model

        # A server's ops are small and serial (one update at a time): one thread each, so its
        # thread pools do not spin against the workers' on the same cores.
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        if job.seed is not None:
            keras.utils.set_random_seed(job.seed)
        # The user's own compiled optimizer (any class, schedule or clipping), built on the
        # variables this server owns.
        self.optimizer = build_compiled_model(job).optimizer
        self.names = [v["name"] for v in variables]
        self.trainable = [
            keras.Variable(v["value"], trainable=True, name=_safe(v["name"]))
            for v in variables
            if v["trainable"]
        ]
        self.extras = [
            keras.Variable(v["value"], trainable=False, name=_safe(v["name"]))
            for v in variables
            if not v["trainable"]
        ]
        if self.trainable:
            self.optimizer.build(self.trainable)
        trainable, extras = self.trainable, self.extras
        sizes = [int(v["value"].size) for v in variables]
        n_trainable = len(trainable)

        # Workers send one flat float32 buffer: the gradients of this server's trainable
        # variables, then the new values of its non-trainable ones.
        @tf.function
        def apply(flat: tf.Tensor) -> None:
            parts = tf.split(flat, sizes)
            grads = [
                tf.cast(tf.reshape(p, v.shape), v.dtype)
                for p, v in zip(parts[:n_trainable], trainable)
            ]
            if trainable:
                self.optimizer.apply_gradients(zip(grads, trainable))
            for p, v in zip(parts[n_trainable:], extras):
                v.assign(tf.cast(tf.reshape(p, v.shape), v.dtype))

        @tf.function
        def values() -> tf.Tensor:
            return tf.concat(
                [tf.reshape(tf.cast(v.value, tf.float32), [-1]) for v in trainable + extras], 0
            )

        self._apply, self._flat_values = apply, values
        total = sum(sizes)
        # Trace both now, not on the first step (nothing runs: tracing creates no state).
        apply.get_concrete_function(tf.TensorSpec([total], tf.float32))
        values.get_concrete_function()
        if config.get("servers", 1) > 1:
            _check_shardable(self.optimizer, config["servers"])
        self.init_protocol(config["workers"], config["staleness"], config.get("backup_workers", 0))
        epoch, step = self._setup_checkpoint(
            config.get("checkpoint_dir"), config.get("resume", False)
        )
        self._snapshot_at = None
        nbytes = sum(int(v["value"].nbytes) for v in variables)
        return {
            "start_epoch": epoch,
            "start_step": step,
            "restored": self.restored,
            "bytes": nbytes,
            "variables": len(self.names),
        }

    def _setup_checkpoint(self, directory: str | None, resume: bool) -> tuple[int, int]:
        import tensorflow as tf

        self._manager = None
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._version = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.restored: str | None = None
        if not directory:
            return 0, 0
        own = self.trainable + self.extras
        ckpt = tf.train.Checkpoint(
            variables=dict(zip([_safe(n) for n in self.names], own)),
            optimizer=self.optimizer,
            epoch=self._epoch,
            step=self._step,
            version=self._version,
        )
        path = os.path.join(directory, f"ps-{self.index}")
        self._manager = tf.train.CheckpointManager(ckpt, path, max_to_keep=3)
        listing = os.path.join(path, "variables.json")
        if resume and self._manager.latest_checkpoint:
            with open(listing) as f:
                saved = json.load(f)
            if saved != self.names:
                raise ConfigError(
                    f"{self.name}: the checkpoint in {path} holds {saved}, this run puts "
                    f"{self.names} here: the sharding changed (another ps= or model). Resume "
                    "with the settings that wrote it, or use a new checkpoint_dir."
                )
            self.restored = self._manager.latest_checkpoint
            ckpt.restore(self.restored).assert_existing_objects_matched()
            self.version = int(self._version.numpy())
        os.makedirs(path, exist_ok=True)
        with open(listing, "w") as f:
            json.dump(self.names, f)
        return int(self._epoch.numpy()), int(self._step.numpy())

    def init_protocol(self, workers: int, staleness: int | None, backup_workers: int) -> None:
        """The consistency state machine, apart from TensorFlow (unit-tested on its own)."""
        self.workers = workers
        self.staleness = staleness
        self.quorum = workers - backup_workers
        self.version = getattr(self, "version", 0)
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

    @surface_async_errors
    async def save(self, epoch: int, step: int | None = None) -> str | None:
        """Checkpoint at ``step`` of ``epoch``, or (None) at its end; numbered by version."""
        if self._manager is None:
            return None
        self._epoch.assign(epoch + 1 if step is None else epoch)
        self._step.assign(0 if step is None else step)
        self._version.assign(self.version)
        return self._manager.save(checkpoint_number=self.version)

    # ------------------------------------------------------------------ traffic
    async def pull(self, worker: int, step: int | None) -> tuple[int, Any, bool]:
        """(version, values, epoch done) for the worker's ``step`` (None: now, no wait)."""
        if step is not None:
            await self._wait_for_bound(step)
        return self.version, self._values(), self.done()

    @surface_async_errors
    async def push(
        self, worker: int, version: int, flat: Any, want_weights: bool, generation: int = 0
    ) -> tuple[int, Any, bool]:
        """The flat gradients (and non-trainable values) of ``worker``, computed on
        ``version`` of this shard.

        Returns (version, values, epoch done); values are the weights for the worker's next
        step when ``want_weights`` (saving it a round trip), else None.
        """
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
        t0 = time.perf_counter()
        self._apply(flat)
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
            self._snapshot = self._flat_values().numpy()
            self._snapshot_at = self.version
        self.stats["pulls"] += 1
        self.stats["bytes_out"] += self._snapshot.nbytes
        return self._snapshot

    async def report(self) -> dict[str, Any]:
        """Load and staleness measured on this server."""
        return {
            "name": self.name,
            "variables": len(self.names),
            "version": self.version,
            **self.stats,
            "staleness": dict(self.staleness_hist),
            "steps_ahead": dict(self.gap_hist),
        }


def _check_shardable(optimizer: Any, servers: int) -> None:
    """Optimizers that look at every gradient at once cannot be split over servers."""
    import keras

    if getattr(optimizer, "global_clipnorm", None):
        raise ConfigError(
            f"The optimizer clips by global norm (global_clipnorm="
            f"{optimizer.global_clipnorm}), but with ps={servers} each server sees only its "
            "share of the gradients. Use ps=1, or clipnorm=/clipvalue= (per variable)."
        )
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ConfigError(
            f"A LossScaleOptimizer keeps one loss scale for all gradients; with ps={servers} "
            "each server would adjust its own. Use ps=1 with mixed precision."
        )


def _mean(arrays: list[Any], n: int) -> Any:
    total = arrays[0].copy()
    for a in arrays[1:]:
        total += a
    total /= n
    return total


def _safe(name: str) -> str:
    """Keras variable names may not contain '/'."""
    return name.replace("/", "_")

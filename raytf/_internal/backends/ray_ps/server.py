"""A parameter-server shard: an async Ray actor owning some variables and their optimizer state.

Workers pull weights and push gradients; :class:`~.protocol.ShardProtocol` decides what is
applied when. The shard applies gradients with the model's own Keras optimizer, so optimizer
state (Adam's moments, the iteration count behind learning-rate schedules) lives with the
variables, and checkpoints that state with them.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from raytf._internal.backends.ray_ps.protocol import Reply, ShardProtocol
from raytf._internal.backends.ray_ps.wire import TCP, WireServer
from raytf._internal.worker.process import Process, surface_errors
from raytf.errors import ConfigError


class ParameterShard:
    """One parameter server. A plain class: the backend makes it a Ray actor at spawn."""

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self.proc = Process(name, handle_sigterm=False)
        self.wire: WireServer | None = None

    async def ready(self) -> dict[str, Any]:
        return self.proc.info(role="ps")

    @surface_errors
    async def set_learning_rate(self, value: float) -> None:
        """A Keras callback's new rate (between epochs: no update is in flight)."""
        self.optimizer.learning_rate = value

    @surface_errors
    async def build(
        self, job: Any, variables: list[dict[str, Any]], config: dict[str, Any]
    ) -> dict[str, Any]:
        """Own ``variables`` (initial values from worker 0), with the model's optimizer.

        ``config``: workers, servers, staleness (None = async), backup_workers,
        checkpoint_dir, resume. Returns where to start (after a restore) and the bytes held.
        """
        import keras
        import numpy as np
        import tensorflow as tf

        from raytf._internal.worker.model import build_compiled_model

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
        trainable = [
            keras.Variable(v["value"], trainable=True, name=_safe(v["name"]))
            for v in variables
            if v["trainable"]
        ]
        extras = [
            keras.Variable(v["value"], trainable=False, name=_safe(v["name"]))
            for v in variables
            if not v["trainable"]
        ]
        self.own = trainable + extras
        if trainable:
            self.optimizer.build(trainable)
        sizes = [int(v["value"].size) for v in variables]
        n_trainable = len(trainable)
        # Mixed precision: the loss scale travels with the weights (see step.py).
        scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        extra = [1] if scaled else []

        # Workers send one flat float32 buffer: the gradients of this server's trainable
        # variables, then the new values of its non-trainable ones (then their loss scale).
        def apply(flat: tf.Tensor) -> None:
            parts = tf.split(flat, sizes + extra)
            grads = [
                tf.cast(tf.reshape(p, v.shape), v.dtype)
                for p, v in zip(parts[:n_trainable], trainable)
            ]
            if scaled:  # a gradient computed at an older scale, brought to the current one
                ratio = tf.cast(self.optimizer.dynamic_scale.value, tf.float32) / parts[-1][0]
                grads = [g * tf.cast(ratio, g.dtype) for g in grads]
            if trainable:
                self.optimizer.apply_gradients(zip(grads, trainable))
            for p, v in zip(parts[n_trainable : len(sizes)], extras):
                v.assign(tf.cast(tf.reshape(p, v.shape), v.dtype))

        def values() -> tf.Tensor:
            pieces = [tf.reshape(tf.cast(v.value, tf.float32), [-1]) for v in self.own]
            if scaled:
                pieces.append(tf.reshape(self.optimizer.dynamic_scale.value, [1]))
            return tf.concat(pieces, 0)

        # Traced now, not on the first step (nothing runs: tracing creates no state).
        apply, self.xla = _compiled(apply, tf.TensorSpec([sum(sizes + extra)], tf.float32))
        values, _ = _compiled(values)
        if config.get("servers", 1) > 1:
            _check_shardable(self.optimizer, config["servers"])
        epoch, step, version = self._setup_checkpoint(
            config.get("checkpoint_dir"), config.get("resume", False), config.get("keep", 3)
        )

        def update(flat: Any) -> bool:
            """Apply one flat push; False for a stale overflow, which is dropped: computed at
            a larger scale than now, the scale was already halved for it (asynchronous
            pushes), and Keras would not halve twice."""
            stale = scaled and flat[-1] > float(self.optimizer.dynamic_scale.numpy())
            if stale and not np.isfinite(flat[:-1]).all():
                return False
            apply(flat)
            return True

        self.protocol = ShardProtocol(
            config["workers"],
            config["staleness"],
            config.get("backup_workers", 0),
            apply=update,
            values=lambda: values().numpy(),
            version=version,
        )
        address = None
        self.transport = config.get("transport", TCP)
        if self.transport == TCP:
            if self.wire is not None:
                self.wire.close()
            self.wire = WireServer(self.protocol, self.name)
            address = await self.wire.start()
        from raytf._internal.worker.keras_callbacks import plain_learning_rate

        return {
            "start_epoch": epoch,
            "start_step": step,
            "restored": self.restored,
            # A callback's rate restored with the optimizer: the workers' callbacks start there.
            "learning_rate": plain_learning_rate(self.optimizer),
            "bytes": sum(int(v["value"].nbytes) for v in variables),
            "variables": len(self.names),
            "address": address,  # where workers pull and push (transport="tcp")
        }

    def _setup_checkpoint(
        self, directory: str | None, resume: bool, keep: int
    ) -> tuple[int, int, int]:
        """Checkpointing of this shard; (epoch, step, version) restored when resuming."""
        import tensorflow as tf

        self._manager = None
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._version = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.restored: str | None = None
        if not directory:
            return 0, 0, 0
        from raytf._internal.worker.checkpoints import RATE, BuiltRate

        rate = BuiltRate(self.optimizer)
        state = dict(
            variables=dict(zip([_safe(n) for n in self.names], self.own)),
            optimizer=self.optimizer,
            epoch=self._epoch,
            step=self._step,
            version=self._version,
        )
        # Saved with the builder's rate; restored without it (read on its own), so shards
        # written before raytf saved it still match.
        ckpt = tf.train.Checkpoint(**state, **{RATE: rate.variable})
        path = os.path.join(directory, f"ps-{self.index}")
        self._manager = tf.train.CheckpointManager(ckpt, path, max_to_keep=keep)
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
            tf.train.Checkpoint(**state).restore(self.restored).assert_existing_objects_matched()
            rate.after_restore(self.restored)
        os.makedirs(path, exist_ok=True)
        with open(listing, "w") as f:
            json.dump(self.names, f)
        return int(self._epoch.numpy()), int(self._step.numpy()), int(self._version.numpy())

    @surface_errors
    async def save(self, epoch: int, step: int | None = None) -> str | None:
        """Checkpoint at ``step`` of ``epoch``, or (None) at its end; numbered by version."""
        if self._manager is None:
            return None
        version = self.protocol.version
        self._epoch.assign(epoch + 1 if step is None else epoch)
        self._step.assign(0 if step is None else step)
        self._version.assign(version)
        return self._manager.save(checkpoint_number=version)

    # The protocol's calls, as this actor's methods (transport="object-store"; with "tcp"
    # pulls and pushes arrive through wire.py on this same event loop).
    async def start_epoch(self, steps: int) -> None:
        await self.protocol.start_epoch(steps)

    async def pull(self, worker: int, step: int | None) -> Reply:
        return await self.protocol.pull(worker, step)

    @surface_errors
    async def push(
        self, worker: int, version: int, flat: Any, want_weights: bool, generation: int = 0
    ) -> Reply:
        return await self.protocol.push(worker, version, flat, want_weights, generation)

    async def forget(self, worker: int) -> int:
        return await self.protocol.forget(worker)

    async def rejoin(self, worker: int, clock: int) -> int:
        return await self.protocol.rejoin(worker, clock)

    async def report(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "variables": len(self.names),
            "transport": self.transport,
            "xla": self.xla,
            **self.protocol.report(),
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


def _compiled(fn: Any, *specs: Any) -> tuple[Any, bool]:
    """``fn`` as one XLA computation when XLA can lower it, else as a plain tf.function.

    Why: a server's update is the whole optimizer over every variable it holds, serialised
    by its event loop; fused by XLA, Adam over the README's MLP takes 0.6 ms instead of
    1.2 ms on one CPU thread (``experiments/ps_wire.py``). An op XLA lacks (a user's
    optimizer may use one) shows while lowering, before anything runs.
    """
    import tensorflow as tf

    fused = tf.function(fn, jit_compile=True)
    try:
        fused.experimental_get_compiler_ir(*specs)(stage="hlo")
        return fused, True
    except Exception as exc:  # not lowerable: the same function without XLA
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        logging.getLogger("raytf").warning(
            "%s runs without XLA, which cannot lower it: %s", fn.__name__, first[:300]
        )
        plain = tf.function(fn)
        plain.get_concrete_function(*specs)
        return plain, False


def _safe(name: str) -> str:
    """Keras variable names may not contain '/'."""
    return name.replace("/", "_")

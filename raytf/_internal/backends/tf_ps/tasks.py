"""TensorFlow's parameter-server backend, worker side: the tasks and the chief, as actors.

Worker and ps tasks are ``tf.distribute.Server`` processes that only serve; the chief runs
``ParameterServerStrategy`` and ``ClusterCoordinator`` and schedules raytf's step loop onto
the workers in closures (asynchronous; TensorFlow reschedules the closures of a lost worker).
Two TensorFlow behaviours shape this file (measured):

- under this strategy the input context always says pipeline 0 of 1; the worker's index comes
  from ``experimental_get_current_worker_index`` inside the dataset function;
- ``model.fit`` fails here, so raytf's loop is scheduled as is.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from raytf._internal.job import Job
from raytf._internal.spec import StrategySpec
from raytf._internal.worker.process import Process, surface_errors

if TYPE_CHECKING:
    from raytf._internal.worker.loop import Block


def _set_tf_config(spec: StrategySpec, role: str, index: int) -> None:
    from raytf._internal.tf_config import tf_config_json

    os.environ["TF_CONFIG"] = tf_config_json(spec.cluster, role, index)


class TFServerTask:
    """A TensorFlow ``worker`` or ``ps`` task: it only serves; the chief drives it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc = Process(name)

    def ready(self) -> dict[str, Any]:
        return self.proc.info()

    def reserve_address(self) -> str:
        return self.proc.reserve_address()

    @surface_errors
    def start(self, spec: StrategySpec) -> dict[str, Any]:
        import tensorflow as tf

        devices: list[str] = []
        kind = "CPU"
        if spec.role == "worker":  # its GPU, memory growth on, before the server starts
            from raytf._internal.worker.devices import configure_devices

            devices, kind = configure_devices(spec)
        _set_tf_config(spec, spec.role, spec.worker_index)
        self.proc.release_address()
        # Held by the actor for its lifetime; killing the actor is how it stops.
        # The server builds its devices from this config, not from the eager context:
        # memory growth has to be said here too.
        config = tf.compat.v1.ConfigProto(gpu_options=tf.compat.v1.GPUOptions(allow_growth=True))
        self.server = tf.distribute.Server(
            tf.train.ClusterSpec(spec.cluster),
            job_name=spec.role,
            task_index=spec.worker_index,
            protocol="grpc",
            config=config,
            start=True,
        )
        address = spec.cluster[spec.role][spec.worker_index]
        return {"devices": devices, "device_kind": kind, "address": address, "role": spec.role}

    def serve(self) -> None:
        """Block while the server runs: the driver holds this call to learn of its death."""
        self.server.join()


class ScheduledRunner:
    """The chief's steps: ``steps`` batches for each worker, in closures of up to K steps."""

    def __init__(self, md: Any, coordinator: Any, job: Job, num_workers: int) -> None:
        import tensorflow as tf

        from raytf._internal.worker import steps as S

        self.md, self.coordinator, self.job, self.workers = md, coordinator, job, num_workers
        self.clock = S.StepClock()
        self.batch = md.ctx.worker_batch_size
        self._train_n = S.loop_of(S.replica_step(md))
        evaluate = S.eval_step(md, replicated=False)  # plain calls on the chief
        self._eval_n, self._eval_all = S.loop_of(evaluate), S.loop_all(evaluate)
        self._val = None
        if md.validation is not None:
            self._val = md.validation.repeat().prefetch(tf.data.AUTOTUNE)
        unit = md.unit(md.ctx)
        contexts = [
            md.ctx.__class__(**{**md.ctx.__dict__, "worker_index": i}) for i in range(num_workers)
        ]

        def dataset_fn(_: Any) -> tf.data.Dataset:
            # Traced once and sent to every worker (datasets cannot be captured from the
            # chief), so every shard is built here and the worker picks its own; the data
            # function still sees a plain int worker_index.
            shards = [
                md.weighted(job.data_fn(ctx).batch(unit, drop_remainder=True)).repeat()
                for ctx in contexts
            ]
            index = tf.cast(
                tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64
            )
            choice = tf.data.Dataset.from_tensors(index).repeat()
            picked = tf.data.Dataset.choose_from_datasets(shards, choice)
            return picked.prefetch(tf.data.AUTOTUNE)

        strategy = md.strategy
        per_worker = coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(dataset_fn)
        )
        self._iterator = iter(per_worker)

    def seek(self, batches: int) -> None:
        """TensorFlow's workers hold the data: a resumed run starts their data afresh."""

    def train(self, steps: int, block: Block) -> int:
        """``steps`` global steps (a batch on each worker), in closures; ``block`` may stop
        scheduling more (a callback's ``stop_training``). The closures run asynchronously:
        batch hooks see the logs of the closures done so far. Returns the steps trained."""
        import tensorflow as tf

        from raytf._internal.worker.loop import steps_per_call

        total = steps * self.workers
        k = steps_per_call(self.job, total)
        done = 0
        first = 0
        t0 = time.perf_counter()
        while done < total and block.go_on(done // self.workers):
            n = min(k, total - done) if self.clock.warm else 1  # trace once, as others do
            block.begin(done // self.workers)
            self.coordinator.schedule(self._train_n, args=(self._iterator, tf.constant(n)))
            if not self.clock.warm:
                self.coordinator.join()
                self.clock.record(1, t0)
                first, t0 = n, time.perf_counter()
            block.end(done // self.workers, max(1, n // self.workers))
            done += n
        self.coordinator.join()
        if done > first:
            self.clock.record(done - first, t0)
        return -(-done // self.workers)

    def evaluate(self, validation_steps: int) -> None:
        import tensorflow as tf

        from raytf._internal.worker.model import WHOLE

        if validation_steps == WHOLE:
            self._eval_all(self.md.validation).numpy()
        else:
            self._eval_n(iter(self._val), tf.constant(validation_steps)).numpy()


class TFChief:
    """The chief task: ParameterServerStrategy, ClusterCoordinator and raytf's loop."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc = Process(name)

    def ready(self) -> dict[str, Any]:
        return self.proc.info()

    def reserve_address(self) -> str:
        return self.proc.reserve_address()

    @surface_errors
    def start(self, spec: StrategySpec) -> dict[str, Any]:
        import tensorflow as tf

        from raytf._internal.backends.tf_ps.keras_patch import atomic_keras_assign_add

        self.spec = spec
        _set_tf_config(spec, "chief", 0)
        self.proc.release_address()
        atomic_keras_assign_add()
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec.cluster), task_type="chief", task_id=0, rpc_layer="grpc"
        )
        self.strategy = tf.distribute.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        address = spec.cluster["chief"][0]
        return {"devices": ["/device:CPU:0"], "device_kind": "CPU", "address": address}

    @surface_errors
    def build(self, job: Job) -> dict[str, Any]:
        from raytf._internal.worker.checkpoints import Checkpoints
        from raytf._internal.worker.keras_callbacks import KerasHooks
        from raytf._internal.worker.loop import TrainLoop
        from raytf._internal.worker.model import ModelData
        from raytf.data import InputContext

        n, gb = self.spec.num_workers, job.global_batch_size
        # Each scheduled step runs one worker's batch: one replica per worker.
        ctx = InputContext(
            worker_index=0,
            num_workers=n,
            replicas_per_worker=1,
            global_batch_size=gb,
            seed=job.seed,
        )
        # The chief evaluates the whole validation set in global batches.
        val_ctx = InputContext(
            worker_index=0,
            num_workers=1,
            replicas_per_worker=1,
            global_batch_size=gb,
            seed=job.seed,
            training=False,
        )
        md = ModelData(job, self.strategy, ctx, val_ctx, False, 1)
        info = md.build()
        checkpoints = Checkpoints(
            job.checkpoint_dir,
            True,
            0,
            job.keep_checkpoints,
            model=md.model,
            optimizer=md.optimizer,
        )
        start = checkpoints.restore() if job.resume else (0, 0)
        runner = ScheduledRunner(md, self.coordinator, job, n)
        steps = job.steps_per_epoch or info["train_steps"]
        hooks = KerasHooks(job.keras_callbacks, md.model, True, job.epochs, steps, start[0] > 0)
        self.loop = TrainLoop(md, runner, checkpoints, hooks=hooks)
        hooks.train_begin()
        return {
            **info,
            "start_epoch": start[0],
            "start_step": start[1],
            "restored": checkpoints.restored,
            "skipped_checkpoints": checkpoints.skipped,
        }

    @surface_errors
    def run_epoch(self, *segment: Any) -> dict[str, Any]:
        return self.proc.guarded(lambda: self.loop.run_epoch(*segment))

    @surface_errors
    def save(self, epoch: int, step: int) -> str | None:
        return self.proc.guarded(lambda: self.loop.save(epoch, step))

    @surface_errors
    def final(self, with_model: bool) -> dict[str, Any]:
        return self.loop.final(with_model)

    @surface_errors
    def placement(self) -> dict[str, str]:
        """Which ps task holds each model and optimizer variable (TensorFlow's round robin)."""
        model = self.loop.md.model
        variables = [*model.weights, *model.optimizer.variables]
        return {v.path: v.value.device for v in variables}

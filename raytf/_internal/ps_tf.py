"""TensorFlow's own parameter-server engine, with every TensorFlow task in a Ray actor.

Worker and ps tasks are ``tf.distribute.Server`` processes; a chief actor runs
``ParameterServerStrategy`` and ``ClusterCoordinator`` and schedules the raytf step loop onto
the workers (asynchronous; TensorFlow reschedules the closures of a lost worker). Three
TensorFlow/Keras behaviours shape this file (measured, see the facts notes):

- under this strategy the input context always says pipeline 0 of 1; the worker's index comes
  from ``experimental_get_current_worker_index`` inside the dataset function;
- Keras 3's ``Variable.assign_add`` reads then writes, so two workers updating one metric lose
  updates (accuracy above 1); the chief makes it the atomic TensorFlow op in its own process;
- ``model.fit`` fails here, so the raytf loop is scheduled as is.

Failures: the driver holds a blocking ``serve`` call on every task, so a task's death is seen
at once, not when TensorFlow gives up on it. A dead ``worker`` task is started again at the
same address while the chief trains on: TensorFlow's coordinator reschedules the lost closures
on the other workers and takes the new task back (re-creating its dataset) when it answers.
A dead ``ps`` task loses variables, the ``UnavailableError`` TensorFlow leaves to the user:
raytf restarts every task from the chief's newest checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import ray

from raytf._internal.coordinator import (
    DEATH_GRACE_S,
    Coordinator,
    WorkerGroup,
    _recoverable,
    _unwrap,
)
from raytf._internal.worker import TrainWorker, surface_errors
from raytf.config import AUTO_STEPS_PER_EXECUTION
from raytf.data import InputContext
from raytf.errors import RaytfError, StartupTimeoutError, WorkerError


class TFServerTask(TrainWorker):
    """A TensorFlow ``worker`` or ``ps`` task: it only serves; the chief drives it."""

    @surface_errors
    def start_strategy(self, spec: Any) -> dict[str, Any]:
        import tensorflow as tf

        from raytf._internal.tf_config import tf_config_json

        os.environ["TF_CONFIG"] = tf_config_json(spec.cluster, spec.role, spec.worker_index)
        address = spec.cluster[spec.role][spec.worker_index]
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        # Held by the actor for its lifetime; killing the actor is how it stops.
        self.server = tf.distribute.Server(
            tf.train.ClusterSpec(spec.cluster),
            job_name=spec.role,
            task_index=spec.worker_index,
            protocol="grpc",
            start=True,
        )
        return {"devices": [], "device_kind": "CPU", "address": address, "role": spec.role}

    def serve(self) -> None:
        """Block while the server runs: the driver holds this call to learn of its death."""
        self.server.join()


def _atomic_keras_assign_add() -> None:
    """Keras 3 implements assign_add as assign(self + x): lost updates under concurrent
    workers. Use TensorFlow's atomic op for the variables of this (chief) process."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.tensorflow.core import Variable

    def atomic(name: str) -> Any:
        keras_op = getattr(Variable, name)

        def op(self: Any, value: Any) -> Any:
            if in_stateless_scope() or self._value is None:  # symbolic build: Keras's path
                return keras_op(self, value)
            import tensorflow as tf

            return getattr(self._value, name)(tf.cast(value, self._value.dtype))

        return op

    if not getattr(Variable, "_raytf_atomic", False):
        Variable.assign_add = atomic("assign_add")
        Variable.assign_sub = atomic("assign_sub")
        Variable._raytf_atomic = True


class TFChief(TrainWorker):
    """The chief task: ParameterServerStrategy, ClusterCoordinator and the raytf engine."""

    @surface_errors
    def start_strategy(self, spec: Any) -> dict[str, Any]:
        import tensorflow as tf

        from raytf._internal.tf_config import tf_config_json

        self.spec = spec
        os.environ["TF_CONFIG"] = tf_config_json(spec.cluster, "chief", 0)
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        _atomic_keras_assign_add()
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec.cluster), task_type="chief", task_id=0, rpc_layer="grpc"
        )
        self.strategy = tf.distribute.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        self.devices, self.device_kind = ["/device:CPU:0"], "CPU"
        return {"devices": self.devices, "device_kind": "CPU", "address": spec.cluster["chief"][0]}

    @surface_errors
    def build(self, job: Any) -> dict[str, Any]:
        self._engine = _tf_engine()(self.spec, job, self.devices, self.strategy, self.coordinator)
        return self._engine.build()

    @surface_errors
    def placement(self) -> dict[str, str]:
        """Which ps task holds each model and optimizer variable (TensorFlow's round robin)."""
        model = self._engine.model
        variables = [*model.weights, *model.optimizer.variables]
        return {v.path: v.value.device for v in variables}


def _tf_engine() -> type:
    """The engine subclass, defined on first use: it imports TensorFlow."""
    import tensorflow as tf

    from raytf._internal.engine import Engine

    class TFPSEngine(Engine):
        def __init__(self, spec: Any, job: Any, devices: list, strategy: Any, coord: Any):
            super().__init__(spec, job, devices, strategy)
            self.coordinator = coord
            # Each scheduled step runs one worker's batch: one replica per worker.
            self.replicas_per_worker = 1
            self.ctx = InputContext(
                worker_index=0,
                num_workers=spec.num_workers,
                replicas_per_worker=1,
                global_batch_size=job.global_batch_size,
                seed=job.seed,
            )

        def _distribute(self, dataset: tf.data.Dataset) -> Any:
            return dataset  # validation runs on the chief; training data is set up below

        def _validation_context(self) -> InputContext:
            # The chief evaluates the whole validation set in global batches.
            return InputContext(
                worker_index=0,
                num_workers=1,
                replicas_per_worker=1,
                global_batch_size=self.job.global_batch_size,
                seed=self.job.seed,
                training=False,
            )

        def build(self) -> dict[str, Any]:
            info = super().build()
            n = self.spec.num_workers
            unit = self.ctx.worker_batch_size
            contexts = [InputContext(**{**self.ctx.__dict__, "worker_index": i}) for i in range(n)]

            def dataset_fn(_: Any) -> tf.data.Dataset:
                # Traced once and sent to every worker (datasets cannot be captured from the
                # chief), so every shard is built here and the worker picks its own; the data
                # function still sees a plain int worker_index.
                shards = [
                    self.job.data_fn(ctx).batch(unit, drop_remainder=True).repeat()
                    for ctx in contexts
                ]
                index = tf.cast(
                    tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64
                )
                choice = tf.data.Dataset.from_tensors(index).repeat()
                picked = tf.data.Dataset.choose_from_datasets(shards, choice)
                return picked.prefetch(tf.data.AUTOTUNE)

            per_worker = self.coordinator.create_per_worker_dataset(
                lambda: self.strategy.distribute_datasets_from_function(dataset_fn)
            )
            self._iterator = iter(per_worker)
            self._eval_n = self._make_loop(self._towers_eval)  # plain calls on the chief
            return info

        def seek(self, batches: int) -> None:
            """TensorFlow's workers hold the data: a resumed run starts their data afresh."""

        def _train_steps(
            self, steps: int, epoch: int = 0, start: int = 0, epoch_steps: int | None = None
        ) -> None:
            """``steps`` batches for each worker, scheduled in closures of up to K steps."""
            import time

            total = steps * self.spec.num_workers
            k = self.steps_per_execution(total)
            done = 0
            if self.first_step_at is None:  # trace once, as the other engines do
                self.coordinator.schedule(self._train_n, args=(self._iterator, tf.constant(1)))
                self.coordinator.join()
                self.first_step_at = time.time()
                done = 1
            t0 = time.perf_counter()
            counted = total - done
            while done < total:
                n = min(k, total - done)
                self.coordinator.schedule(self._train_n, args=(self._iterator, tf.constant(n)))
                done += n
            self.coordinator.join()
            self._steady_steps += counted
            self._steady_seconds += time.perf_counter() - t0

    return TFPSEngine


class TFGroup(WorkerGroup):
    """Every TensorFlow task; after start-up, calls go to the chief alone."""

    def spawn(self) -> None:
        bundles = self.layout.bundles()
        for i, (role, index) in enumerate(self.layout.roles()):
            cls = TFChief if role == "chief" else TFServerTask
            name = "chief" if role == "chief" else f"{role}-{index}"
            self.actors.append(self._spawn(cls, i, bundles[i], name))
            self.names.append(name)
        self.tasks: list[Any] = []
        self.task_names: list[str] = []

    def shutdown(self) -> None:
        self.actors += self.tasks
        self.tasks = []
        super().shutdown()


class TFParameterServerCoordinator(Coordinator):
    group_class = TFGroup
    mid_epoch_checkpoints = False  # TensorFlow's coordinator runs whole epochs of closures

    def _start_strategies(self, group: TFGroup, specs: list[Any]) -> list[Any]:  # type: ignore[override]
        """Servers first (the chief connects to them), then the chief; then only it is called."""
        t = self.timeouts
        self._specs = specs
        served = group.call_on(
            group.actors[:-1],
            group.names[:-1],
            "start_strategy",
            [(s,) for s in specs[:-1]],
            t.peers_s,
            "peers",
        )
        chief = group.call_on(
            group.actors[-1:],
            group.names[-1:],
            "start_strategy",
            [(specs[-1],)],
            t.peers_s,
            "peers",
        )
        self.task_rows = [dict(d) for d in served]
        group.tasks, group.task_names = group.actors[:-1], group.names[:-1]
        group.actors, group.names = group.actors[-1:], group.names[-1:]
        return chief

    def _start(self, placement: Any) -> tuple[WorkerGroup, list, list]:
        group, ready, devices = super()._start(placement)
        # Rows of the worker and ps tasks; the chief's row is the run's one "worker".
        self.task_rows = [{**r, **d} for r, d in zip(ready[:-1], self.task_rows)]
        self.server_rows = self.task_rows  # callbacks see every task (RunInfo.servers)
        self._watch = {task.serve.remote(): i for i, task in enumerate(group.tasks)}
        return group, ready[-1:], devices

    def _train(self, group: TFGroup, args: tuple, timeout_s: float) -> list[dict[str, Any]]:  # type: ignore[override]
        """The chief's segment, watching every task: a dead worker task is started again
        in place while the chief goes on; a dead ps task ends the attempt."""
        chief = group.actors[0].run_epoch.remote(*args)
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait([chief, *self._watch], num_returns=1, timeout=left)
            if not ready:
                raise StartupTimeoutError(group._timeout_message("epoch", timeout_s, ["chief"]))
            if ready[0] == chief:
                try:
                    return [ray.get(chief)]
                except Exception as exc:
                    error = _unwrap(exc, "chief")
                    # TensorFlow's UnavailableError on the chief: name the task that died.
                    dead, _ = ray.wait(list(self._watch), timeout=DEATH_GRACE_S)
                    if _recoverable(error) and dead:
                        name = group.task_names[self._watch[dead[0]]]
                        error = WorkerError(
                            f"{name} died ({error})", worker=name, error_type="RayActorError"
                        )
                    raise error from None
            i = self._watch.pop(ready[0])
            name = group.task_names[i]
            try:
                ray.get(ready[0])
                error: RaytfError = WorkerError(
                    f"{name} stopped serving", worker=name, error_type="RayActorError"
                )
            except Exception as exc:
                error = _unwrap(exc, name)  # type: ignore[assignment]
            lost_ps = self._specs[i].role == "ps"
            if lost_ps or len(self._run.failures) >= self.failure_policy.max_failures:
                raise error
            self._restart_task(group, i, error)

    def _restart_task(self, group: TFGroup, i: int, error: RaytfError) -> None:
        """Start worker task ``i`` again at its address; TensorFlow reconnects to it."""
        t = self.timeouts
        with contextlib.suppress(Exception):
            ray.kill(group.tasks[i], no_restart=True)
        name = group.task_names[i]
        # If its address cannot be had again (the node is gone, the port taken), the group
        # restarts with fresh addresses from the checkpoint.
        with self._replacing(error) as record:
            task = group._spawn(TFServerTask, i, self.layout.bundles()[i], name)
            group.tasks[i] = task
            row = group.call_on([task], [name], "ready", None, t.start_s, "start")[0]
            spec = [(self._specs[i],)]
            group.call_on([task], [name], "start_strategy", spec, t.peers_s, "peers")
        self._watch[task.serve.remote()] = i
        spe = self._job.steps_per_execution
        # TensorFlow re-runs a closure the task was running: at most its K steps twice.
        self._replaced(record, row, AUTO_STEPS_PER_EXECUTION if spe == "auto" else int(spe), None)

    def _report(self, group: TFGroup) -> dict[str, Any]:  # type: ignore[override]
        placement = group.call("placement", None, self.timeouts.start_s, "final")[0]
        servers = []
        for row in self.task_rows:
            if row.get("role") != "ps":
                continue
            task = "/job:ps/replica:0/task:" + row["name"].split("-")[1] + "/"
            holds = sorted(p for p, d in placement.items() if task in d + "/")
            servers.append({**row, "holds": holds})
        return {"servers": servers}

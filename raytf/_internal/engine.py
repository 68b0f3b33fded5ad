"""raytf's own training loop, shared by every layout.

Keras 3 ``model.fit`` fails under multi-worker strategies, so raytf drives the model itself:
the compiled loss, optimizer and metrics of any Keras 3 model, a ``tf.function`` that runs
several steps per call, an eval pass and TensorFlow checkpoints. This module imports
TensorFlow; only worker actors (and benchmarks) import it, after their devices are set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from raytf._internal.job import Job
from raytf._internal.spec import MIRRORED, MULTI_WORKER, TOWERS, StrategySpec
from raytf._internal.tf_config import tf_config_json
from raytf.config import AUTO_STEPS_PER_EXECUTION
from raytf.data import InputContext
from raytf.errors import ConfigError, Preempted


def configure_devices(spec: StrategySpec) -> tuple[list[str], str]:
    """Make the devices the spec asks for visible to TensorFlow; must run before any op.

    Returns the device names and their kind. Without a GPU that TensorFlow can use (fake GPUs
    declared to Ray, or tensorflow-cpu), logical CPU devices stand in, and the kind says so.
    """
    if spec.use_gpu:
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            for gpu in gpus:  # two actors on one node must not each grab all memory
                tf.config.experimental.set_memory_growth(gpu, True)
            if len(gpus) < spec.devices:
                raise ConfigError(
                    f"The actor was given {spec.devices} GPU(s) but TensorFlow sees "
                    f"{len(gpus)} (CUDA_VISIBLE_DEVICES="
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Check that the TensorFlow build "
                    "has CUDA (pip install 'raytf[gpu]') and that `raytf plan` matches the node."
                )
            return [f"/device:GPU:{i}" for i in range(spec.devices)], "GPU"
        kind = "CPU (stand-in: TensorFlow sees no GPU)"
    else:
        kind = "CPU"
    # MultiWorkerMirroredStrategy drives a single CPU device per worker.
    count = 1 if spec.kind == MULTI_WORKER else spec.devices
    if count > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    return [f"/device:CPU:{i}" for i in range(count)], kind


def make_strategy(spec: StrategySpec, devices: list[str]) -> tf.distribute.Strategy | None:
    """The tf.distribute strategy for the spec; None for towers (default strategy)."""
    if spec.kind == TOWERS:
        return None
    if spec.kind == MIRRORED:
        return tf.distribute.MirroredStrategy(devices=devices)
    if spec.kind == MULTI_WORKER:
        if spec.cluster is None:
            raise ConfigError("A multi-worker spec needs the cluster's addresses.")
        os.environ["TF_CONFIG"] = tf_config_json(spec.cluster, "worker", spec.worker_index)
        impl = tf.distribute.experimental.CommunicationImplementation
        chosen = {"ring": impl.RING, "nccl": impl.NCCL, "auto": impl.AUTO}[spec.communication]
        options = tf.distribute.experimental.CommunicationOptions(implementation=chosen)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    raise ConfigError(f"Unknown strategy kind {spec.kind!r}.")


def _unpack(data: Any) -> tuple[Any, Any, Any]:
    if isinstance(data, (tuple, list)):
        if len(data) == 2:
            return data[0], data[1], None
        if len(data) == 3:
            return data[0], data[1], data[2]
    return data, None, None


def _fresh(obj: Any) -> Any:
    """A copy of a Keras optimizer or metric made here, inside the strategy scope.

    Objects passed to fit() were unpickled outside the scope, so their variables would not be
    distributed; strings and functions pass through.
    """
    if isinstance(obj, (keras.optimizers.Optimizer, keras.metrics.Metric)):
        return type(obj).from_config(obj.get_config())
    return obj


def _batch_size_of(x: Any) -> tf.Tensor:
    return tf.shape(tf.nest.flatten(x)[0])[0]


def _describe_spec(spec: Any) -> str:
    return repr(tf.nest.map_structure(lambda s: (tuple(s.shape), s.dtype.name), spec))


def build_compiled_model(job: Job) -> keras.Model:
    """The user's model, compiled with its own or the given loss, optimizer and metrics."""
    model = job.model_fn()
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"The model function returned {type(model).__name__} ({model!r:.80}), expected a "
            "keras.Model. Make it `return model`, building a Keras 3 model "
            "(keras.Sequential, functional or subclassed)."
        )
    compiled = getattr(model, "compiled", False) and model.optimizer is not None
    given = job.loss is not None or job.optimizer is not None
    if given and compiled:
        raise ConfigError(
            "The model function returned a compiled model and loss=/optimizer= were "
            "passed too; use one: drop the arguments or the model.compile call."
        )
    if given:
        if job.loss is None:
            raise ConfigError("optimizer= was passed without loss=; pass both.")
        model.compile(
            optimizer=_fresh(job.optimizer or "adam"),
            loss=job.loss,
            metrics=[_fresh(m) for m in job.metrics] or None,
        )
    elif not compiled:
        raise ConfigError(
            "The model function returned a model that is not compiled and no loss= was "
            "given. Call model.compile(optimizer=..., loss=..., metrics=[...]) inside the "
            "model function, or pass loss= and optimizer= to raytf.fit."
        )
    return model


class Engine:
    """Builds the model and data under a strategy and runs epochs; one per worker actor."""

    def __init__(
        self,
        spec: StrategySpec,
        job: Job,
        devices: list[str],
        strategy: tf.distribute.Strategy | None,
    ) -> None:
        self.spec = spec
        self.job = job
        self.devices = devices
        self.strategy = strategy or tf.distribute.get_strategy()
        self.towers = strategy is None and len(devices) > 1
        if strategy is not None:
            self.replicas_per_worker = strategy.num_replicas_in_sync // spec.num_workers
        else:
            self.replicas_per_worker = len(devices)
        self.ctx = InputContext(
            worker_index=spec.worker_index,
            num_workers=spec.num_workers,
            replicas_per_worker=self.replicas_per_worker,
            global_batch_size=job.global_batch_size,
            seed=job.seed,
        )
        self.first_step_at: float | None = None
        self._agree: Any = None  # the all-reduce that agrees on a preemption, traced once
        self._steady_steps = 0
        self._steady_seconds = 0.0

    # ------------------------------------------------------------------ build
    def build(self) -> dict[str, Any]:
        """Model, optimizer, data and checkpoint; returns what the driver must agree on."""
        if self.job.seed is not None:
            keras.utils.set_random_seed(self.job.seed)
        with self.strategy.scope():
            self.model = self._build_model()
            self.optimizer = self.model.optimizer
            self._loss = keras.metrics.Mean(name="loss")
        train, train_steps = self._dataset(self.job.data_fn, "data", self.ctx)
        self._symbolic_build(train.element_spec)
        self._train_batched = train
        self._train_data = self._distribute(train.repeat().prefetch(tf.data.AUTOTUNE))
        self._iterator = iter(self._train_data)
        self._val_data, val_steps = None, None
        if self.job.validation_fn is not None:
            vctx = self._validation_context()
            val, val_steps = self._dataset(self.job.validation_fn, "validation_data", vctx)
            self._val_data = self._distribute(val.repeat().prefetch(tf.data.AUTOTUNE))
        self._train_n = self._make_loop(self._towers_step if self.towers else self._replica_step)
        self._eval_n = self._make_loop(self._towers_eval if self.towers else self._replica_eval)
        start_epoch, start_step = self._setup_checkpoint()
        return {
            "train_steps": train_steps,
            "validation_steps": val_steps,
            "replicas_per_worker": self.replicas_per_worker,
            "start_epoch": start_epoch,
            "start_step": start_step,
            "restored": self.restored,
            "skipped_checkpoints": self.skipped_checkpoints,
            "parameters": int(sum(int(tf.size(v)) for v in self.model.trainable_variables)),
        }

    def _validation_context(self) -> InputContext:
        return InputContext(**{**self.ctx.__dict__, "training": False})

    def _build_model(self) -> keras.Model:
        return build_compiled_model(self.job)

    def _dataset(
        self, fn: Callable[[InputContext], Any], what: str, ctx: InputContext
    ) -> tuple[tf.data.Dataset, int | None]:
        ds = fn(ctx)
        if not isinstance(ds, tf.data.Dataset):
            raise ConfigError(
                f"The {what} function returned {type(ds).__name__}, expected a tf.data.Dataset "
                "of unbatched (features, labels) examples, e.g. "
                "tf.data.Dataset.from_tensor_slices((x, y))."
            )
        spec = ds.element_spec
        if not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3):
            raise ConfigError(
                f"The {what} dataset yields {_describe_spec(spec)}, expected a tuple "
                "(features, labels) or (features, labels, sample_weight)."
            )
        self._check_features(spec[0], what)
        # Towers split one worker batch; strategies take per-replica batches.
        unit = ctx.worker_batch_size if self.towers else ctx.per_replica_batch_size
        per_step = 1 if self.towers else self.replicas_per_worker
        batched = ds.batch(unit, drop_remainder=True)
        cardinality = int(batched.cardinality())
        steps = cardinality // per_step if cardinality >= 0 else None
        wanted = self.job.steps_per_epoch if what == "data" else self.job.validation_steps
        if steps is None and wanted is None:
            name = "steps_per_epoch" if what == "data" else "validation_steps"
            raise ConfigError(
                f"The {what} dataset of worker {ctx.worker_index} has unknown or infinite "
                f"length, so raytf cannot tell where an epoch ends; pass {name}=N."
            )
        if steps == 0:
            raise ConfigError(
                f"The {what} dataset of worker {ctx.worker_index} holds fewer examples than one "
                f"batch of {unit * per_step} (global batch {ctx.global_batch_size} over "
                f"{ctx.num_workers} worker(s)); use a smaller global_batch_size or more data."
            )
        return batched, steps

    def _check_features(self, features: Any, what: str) -> None:
        """Compare unbatched feature shapes with the model's declared inputs, when it has them."""
        try:
            inputs = self.model.inputs
        except (AttributeError, ValueError):
            return
        if not inputs:
            return
        got = tf.nest.flatten(features)
        want = tf.nest.flatten(inputs)
        if len(got) != len(want):
            raise ConfigError(
                f"The {what} dataset yields {len(got)} feature tensor(s) "
                f"{_describe_spec(features)} but the model takes {len(want)} input(s) "
                f"{[tuple(i.shape) for i in want]}."
            )
        for g, w in zip(got, want):
            if g.shape.rank is None:
                continue
            expected = tuple(w.shape)[1:]
            shape = tuple(g.shape)
            if len(shape) == len(expected) + 1 and tf.TensorShape(shape[1:]).is_compatible_with(
                expected
            ):
                raise ConfigError(
                    f"The {what} dataset looks batched already: an example has shape {shape}, "
                    f"the model expects {expected} per example. Return unbatched examples; "
                    "raytf batches them to the worker's share of global_batch_size."
                )
            if not tf.TensorShape(shape).is_compatible_with(expected):
                raise ConfigError(
                    f"The {what} dataset yields examples of shape {shape}, but the model "
                    f"expects {expected} per example (input {w.name!r}). Fix the data "
                    "function or the model's Input shape."
                )

    def _symbolic_build(self, element_spec: Any) -> None:
        """Create every variable (model, loss, metrics, optimizer) before tracing."""
        with self.strategy.scope():
            try:
                self.model._symbolic_build(data_batch=element_spec)
            except (ValueError, TypeError) as exc:  # a shape or dtype the model cannot take
                raise ConfigError(
                    f"The model cannot be built on the data: a batch is "
                    f"{_describe_spec(element_spec)}. Keras said: {exc}"
                ) from exc
            if not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)

    def _distribute(self, dataset: tf.data.Dataset) -> Any:
        if self.towers or self.spec.kind == TOWERS:
            return dataset
        # Each worker already holds its own shard: no auto-sharding, no rebatching.
        return self.strategy.distribute_datasets_from_function(lambda _ctx: dataset)

    # ------------------------------------------------------------------ steps
    def _compute_loss(self, x: Any, y: Any, y_pred: Any, sw: Any, training: bool) -> tf.Tensor:
        fn = getattr(self.model, "_compute_loss", None) or self.model.compute_loss
        return fn(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=training)

    def _forward_backward(self, x: Any, y: Any, sw: Any) -> tuple[Any, Any, list]:
        model = self.model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = self._compute_loss(x, y, y_pred, sw, True)
            scaled = self.optimizer.scale_loss(loss)
        return y_pred, loss, tape.gradient(scaled, model.trainable_variables)

    def _replica_step(self, data: Any) -> None:
        def step(data: Any) -> None:
            x, y, sw = _unpack(data)
            y_pred, loss, grads = self._forward_backward(x, y, sw)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            # Keras scaled the loss by 1/replicas for the gradient sum; report the mean.
            self._loss.update_state(
                loss * self.strategy.num_replicas_in_sync, sample_weight=_batch_size_of(x)
            )
            self.model.compute_metrics(x, y, y_pred, sample_weight=sw)

        self.strategy.run(step, args=(data,))

    def _towers_step(self, data: Any) -> None:
        n = len(self.devices)
        x_all, y_all, sw_all = _unpack(data)
        # Split every tensor of the batch (nested features, labels, weights) n ways.
        batch = (x_all, y_all) if sw_all is None else (x_all, y_all, sw_all)
        splits = [tf.split(t, n, axis=0) for t in tf.nest.flatten(batch)]
        tower_grads = []
        for i, device in enumerate(self.devices):
            x, y, sw = _unpack(tf.nest.pack_sequence_as(batch, [s[i] for s in splits]))
            with tf.device(device):
                y_pred, loss, grads = self._forward_backward(x, y, sw)
            tower_grads.append(grads)
            self._loss.update_state(loss, sample_weight=_batch_size_of(x))
            self.model.compute_metrics(x, y, y_pred, sample_weight=sw)
        averaged = []
        for per_var in zip(*tower_grads):
            if per_var[0] is None:
                averaged.append(None)
            else:
                averaged.append(tf.add_n([tf.convert_to_tensor(g) for g in per_var]) / n)
        self.optimizer.apply_gradients(zip(averaged, self.model.trainable_variables))

    def _eval_one(self, data: Any, scale: int) -> None:
        x, y, sw = _unpack(data)
        y_pred = self.model(x, training=False)
        loss = self._compute_loss(x, y, y_pred, sw, False)
        self._loss.update_state(loss * scale, sample_weight=_batch_size_of(x))
        self.model.compute_metrics(x, y, y_pred, sample_weight=sw)

    def _replica_eval(self, data: Any) -> None:
        self.strategy.run(self._eval_one, args=(data, self.strategy.num_replicas_in_sync))

    def _towers_eval(self, data: Any) -> None:
        self._eval_one(data, 1)

    def _make_loop(self, step: Callable[[Any], None]) -> Callable[[Any, tf.Tensor], tf.Tensor]:
        @tf.function
        def run_n(iterator: Any, n: tf.Tensor) -> tf.Tensor:
            for _ in tf.range(n):
                step(next(iterator))
            return n

        return run_n

    # ------------------------------------------------------------------ epochs
    def _read_metrics(self, prefix: str = "") -> dict[str, float]:
        logs = {k: float(v) for k, v in self.model.get_metrics_result().items()}
        logs["loss"] = float(self._loss.result())
        for metric in [*self.model.metrics, self._loss]:
            metric.reset_state()
        return {prefix + k: v for k, v in logs.items()}

    def steps_per_execution(self, steps: int) -> int:
        spe = self.job.steps_per_execution
        return min(steps, AUTO_STEPS_PER_EXECUTION if spe == "auto" else int(spe))

    def seek(self, batches: int) -> None:
        """Continue the data where a restored checkpoint left it: skip ``batches`` steps."""
        per_step = 1 if self.towers or self.spec.kind == TOWERS else self.replicas_per_worker
        skip = batches * per_step
        passes = int(self._train_batched.cardinality())
        if passes > 0:  # a finite dataset repeats: skip within one pass, not through them all
            skip %= passes
        data = self._train_batched.repeat().skip(skip)
        self._train_data = self._distribute(data.prefetch(tf.data.AUTOTUNE))
        self._iterator = iter(self._train_data)

    def run_epoch(
        self,
        epoch: int,
        steps: int,
        validation_steps: int | None,
        start: int = 0,
        stop: int | None = None,
    ) -> dict[str, Any]:
        """Train steps ``start..stop`` of the epoch (default: all ``steps``); at the epoch's
        end validate and checkpoint. Returns logs (None mid-epoch) and this worker's timing."""
        stop = steps if stop is None else stop
        if start == 0:
            for metric in [*self.model.metrics, self._loss]:
                metric.reset_state()
        self._train_steps(stop - start, epoch, start, steps)
        if stop < steps:
            return {
                "logs": None,
                "throughput": self.throughput,
                "checkpoint": None,
                "global_step": int(self.optimizer.iterations.numpy()),
            }
        return self._end_epoch(epoch, validation_steps)

    def _train_steps(
        self, steps: int, epoch: int = 0, start: int = 0, epoch_steps: int | None = None
    ) -> None:
        k = self.steps_per_execution(steps)
        done = 0
        while done < steps:
            stopping = self._preempted_workers()
            if stopping:  # SIGTERM: every worker saves at this same step, then they leave
                self._stop_for(stopping, epoch, start + done, epoch_steps or steps)
            n = 1 if self.first_step_at is None else min(k, steps - done)
            t0 = time.perf_counter()
            self._train_n(self._iterator, tf.constant(n)).numpy()
            if self.first_step_at is None:
                self.first_step_at = time.time()  # wall clock: the driver compares with its own
            else:
                self._steady_steps += n
                self._steady_seconds += time.perf_counter() - t0
            done += n

    def _preempted_workers(self) -> list[int]:
        """The workers that got SIGTERM. Alone, this one's flag; under all-reduce, agreed by
        a one-number all-reduce before every call of K steps (each worker sets its own bit),
        so all stop at the same step and can write the checkpoint together."""
        if self.spec.num_workers == 1 or self.job.checkpoint_dir is None:
            return [self.spec.worker_index] if self.preempted else []
        if self._agree is None:

            @tf.function
            def agree(bit: tf.Tensor) -> tf.Tensor:
                value = self.strategy.run(lambda: tf.identity(bit))
                return self.strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

            self._agree = agree
        bit = float(2**self.spec.worker_index) if self.preempted else 0.0
        # Every replica of a worker adds its worker's bit: divide by the replicas per worker.
        total = float(self._agree(tf.constant(bit, tf.float64)).numpy())
        mask = round(total / self.replicas_per_worker)
        return [i for i in range(self.spec.num_workers) if mask >> i & 1]

    def _stop_for(self, stopping: list[int], epoch: int, step: int, epoch_steps: int) -> None:
        """Checkpoint at ``step`` (every worker takes part; the chief's copy is kept), then
        raise Preempted so the driver restarts the group from exactly here."""
        name = "worker" if self.spec.num_workers == 1 else "worker-{}"
        who = ", ".join(name.format(i) for i in stopping)
        path, position = None, None
        if self._manager is None:
            saved = "no checkpoint written (no checkpoint_dir)"
        else:
            path, position = self.save(epoch, step), epoch * epoch_steps + step
            saved = f"checkpoint {path} written" if path else "checkpoint written by the chief"
        raise Preempted(
            f"{who} got SIGTERM at epoch {epoch + 1}, step {step}; {saved} before exiting.",
            checkpoint=path,
            position=position,
            worker=name.format(stopping[0]),
        )

    def _end_epoch(self, epoch: int, validation_steps: int | None) -> dict[str, Any]:
        """Metrics, validation, TensorBoard and the checkpoint of a finished epoch."""
        logs = self._read_metrics()
        if self._val_data is not None and validation_steps:
            self._eval_n(iter(self._val_data), tf.constant(validation_steps)).numpy()
            logs.update(self._read_metrics("val_"))
        self._epoch.assign(epoch + 1)
        self._step.assign(0)
        if self._summaries is not None:
            for key, value in logs.items():
                self._summaries.add_scalar(key, value, global_step=epoch + 1)
            self._summaries.flush()
        checkpoint = None
        if self._manager is not None and (
            (epoch + 1) % self.job.checkpoint_every == 0 or epoch + 1 == self.job.epochs
        ):
            checkpoint = self._save_checkpoint()
        return {
            "logs": logs,
            "throughput": self.throughput,
            "checkpoint": checkpoint,
            "global_step": int(self.optimizer.iterations.numpy()),
        }

    @property
    def throughput(self) -> float | None:
        """This worker's examples/second after the first (tracing) call."""
        if not self._steady_seconds:
            return None
        return self._steady_steps * self.ctx.worker_batch_size / self._steady_seconds

    # ------------------------------------------------------------- checkpoints
    def _setup_checkpoint(self) -> tuple[int, int]:
        """Checkpointing, and the restore of a resumed run: (epoch, step in epoch) to go on."""
        self._epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="raytf_epoch")
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="raytf_step")
        self._manager = None
        self._summaries = None
        self.preempted = False
        self.restored: str | None = None
        self.skipped_checkpoints: list[str] = []
        directory = self.job.checkpoint_dir
        if not directory:
            return 0, 0
        if self.spec.is_chief:  # TensorBoard scalars, one point per epoch
            # tensorboardX (a Ray Tune dependency): tensorflow-cpu ships without TensorBoard.
            from tensorboardX import SummaryWriter

            self._summaries = SummaryWriter(os.path.join(directory, "summaries"))
        ckpt = tf.train.Checkpoint(
            model=self.model, optimizer=self.optimizer, epoch=self._epoch, step=self._step
        )
        start = (0, 0)
        if self.job.resume:
            self.restored, self.skipped_checkpoints = restore_newest_valid(ckpt, directory)
            if self.restored is not None:
                start = (int(self._epoch.numpy()), int(self._step.numpy()))
        # Every worker must save (distributed variables are read collectively); only the
        # chief's copy is kept, the others write to a scratch directory they delete.
        if not self.spec.is_chief:
            directory = os.path.join(directory, f".scratch-worker-{self.spec.worker_index}")
        self._manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=3)
        return start

    def save(self, epoch: int, step: int) -> str | None:
        """A checkpoint at ``step`` of ``epoch`` (mid-epoch, for failure recovery)."""
        if self._manager is None:
            return None
        self._epoch.assign(epoch)
        self._step.assign(step)
        return self._save_checkpoint()

    def _save_checkpoint(self) -> str | None:
        # Numbered by global step: mid-epoch and epoch-end checkpoints sort in order.
        path = self._manager.save(checkpoint_number=int(self.optimizer.iterations.numpy()))
        if not self.spec.is_chief:
            shutil.rmtree(self._manager.directory, ignore_errors=True)
            return None
        return path

    # ------------------------------------------------------------------ result
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for w in self.model.get_weights():
            digest.update(w.tobytes())
        return digest.hexdigest()

    def final(self, with_model: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "fingerprint": self.fingerprint(),
            "throughput": self.throughput,
            "first_step_at": self.first_step_at,
            "pid": os.getpid(),  # the process that trained to the end (replacements differ)
        }
        if with_model:
            out["weights"] = self.model.get_weights()
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "model.keras")
                try:
                    self.model.save(path)
                    with open(path, "rb") as f:
                        out["model_bytes"] = f.read()
                except Exception as exc:  # e.g. a subclassed model without get_config
                    out["model_bytes"] = None
                    out["model_save_error"] = f"{type(exc).__name__}: {exc}"
        return out


def restore_newest_valid(ckpt: tf.train.Checkpoint, directory: str) -> tuple[str | None, list]:
    """Restore the newest checkpoint in ``directory`` that reads back whole.

    A checkpoint cut short by a crash (truncated or corrupt files: TensorFlow checks every
    tensor's checksum) is skipped for the one before it. One that does not match the model is
    a user error and raised. Returns (path restored or None, [skipped paths with the reason]).
    """
    state = tf.train.get_checkpoint_state(directory)
    paths = list(state.all_model_checkpoint_paths) if state else []
    skipped = []
    for path in reversed(paths):
        try:
            ckpt.restore(path).assert_existing_objects_matched()
            return path, skipped
        except AssertionError as exc:
            raise ConfigError(
                f"Checkpoint {path} does not match this model ({exc}). Resume with the model "
                "that wrote it, or point checkpoint_dir= at a new directory."
            ) from None
        # Unreadable: DataLoss/NotFound/OutOfRange, or IndexError ("Read less bytes than
        # requested") from a file cut short.
        except (tf.errors.OpError, IndexError) as exc:
            skipped.append(f"{path}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return None, skipped


def run_in_process(spec: StrategySpec, job: Job) -> tuple[Engine, list[dict[str, Any]]]:
    """Run ``job`` in this process without Ray: the engine "by hand", for benchmarks and tests.

    Must be the first TensorFlow work in the process (devices and strategies are set once).
    """
    devices, _ = configure_devices(spec)
    strategy = make_strategy(spec, devices)
    eng = Engine(spec, job, devices, strategy)
    info = eng.build()
    steps = job.steps_per_epoch or info["train_steps"]
    val_steps = job.validation_steps or info["validation_steps"]
    epochs = [eng.run_epoch(e, steps, val_steps) for e in range(info["start_epoch"], job.epochs)]
    return eng, epochs

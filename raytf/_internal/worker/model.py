"""The user's model and data inside one worker: compiled, checked, batched to its share.

Keras 3 ``model.fit`` fails under multi-worker strategies, so raytf drives the model itself:
this module builds what every way of stepping needs (the compiled model, the batched
datasets, the loss and metric trackers) and checks the user's functions with messages that
say what was received and what to do.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from raytf._internal.job import Job
from raytf.data import InputContext
from raytf.errors import ConfigError


def _fresh(obj: Any) -> Any:
    """A copy of a Keras optimizer or metric made here, inside the strategy scope.

    Objects passed to fit() were unpickled outside the scope, so their variables would not be
    distributed; strings and functions pass through.
    """
    if isinstance(obj, (keras.optimizers.Optimizer, keras.metrics.Metric)):
        return type(obj).from_config(obj.get_config())
    return obj


def describe_spec(spec: Any) -> str:
    return repr(tf.nest.map_structure(lambda s: (tuple(s.shape), s.dtype.name), spec))


#: ``validation_steps`` meaning every validation example, the last partial batch too.
WHOLE = -1


def overrides(model: keras.Model, method: str) -> bool:
    """Whether the model's class defines its own ``method`` (train_step, test_step)."""
    return getattr(type(model), method) is not getattr(keras.Model, method)


def class_weight_map(class_weight: dict[int, float], element_spec: Any) -> Callable[..., Any]:
    """Keras' class_weight as sample weights of batched ``(x, y)``, as ``model.fit`` makes
    them (keras/src/trainers/data_adapters/tf_dataset_adapter.py), checked first."""
    if not isinstance(element_spec, (tuple, list)) or len(element_spec) not in (2, 3):
        raise ConfigError(
            f"class_weight needs data of (features, labels) examples, the data yields "
            f"{describe_spec(element_spec)}."
        )
    if len(element_spec) == 3:
        raise ConfigError(
            "class_weight was passed and the data already yields sample weights "
            "(x, y, sample_weight); as in Keras, use one: drop class_weight or fold it into "
            "the sample weights."
        )
    if tf.nest.is_nested(element_spec[1]):
        raise ConfigError(
            f"class_weight needs a single label tensor, the data yields labels "
            f"{describe_spec(element_spec[1])}; as in Keras, pass per-example weights as "
            "(x, y, sample_weight) instead."
        )
    table = tf.constant(
        [float(class_weight.get(c, 1.0)) for c in range(max(class_weight) + 1)],
        dtype=keras.backend.floatx(),
    )

    def weigh(x: Any, y: tf.Tensor) -> tuple[Any, tf.Tensor, tf.Tensor]:
        if y.shape.rank >= 2:
            classes = tf.cond(
                tf.shape(y)[-1] > 1,
                lambda: tf.argmax(y, axis=-1, output_type=tf.int32),
                lambda: tf.cast(tf.round(tf.squeeze(y, axis=-1)), tf.int32),
            )
        else:
            classes = tf.cast(tf.round(y), tf.int32)
        return x, y, tf.gather(table, classes)

    return weigh


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


class ModelData:
    """The compiled model, its optimizer, loss and metrics under ``strategy``, and the
    datasets of this worker batched for its context, ``per_step`` batches a step.

    Towers split one worker batch (``towers``: a batch is the worker's, one a step);
    strategies take per-replica batches (a replica's batch, one per replica a step).
    """

    def __init__(
        self,
        job: Job,
        strategy: tf.distribute.Strategy,
        ctx: InputContext,
        val_ctx: InputContext,
        towers: bool,
        per_step: int,
    ) -> None:
        self.job = job
        self.strategy = strategy
        self.ctx, self.val_ctx = ctx, val_ctx
        self.towers, self.per_step = towers, per_step

    def unit(self, ctx: InputContext) -> int:
        """Examples in one batch of the dataset built for ``ctx``."""
        return ctx.worker_batch_size if self.towers else ctx.per_replica_batch_size

    def build(self) -> dict[str, Any]:
        """Model, optimizer, every variable, and the batched datasets; the numbers the driver
        must agree on."""
        job = self.job
        if job.seed is not None:
            keras.utils.set_random_seed(job.seed)
        with self.strategy.scope():
            self.model = build_compiled_model(job)
            self.optimizer = self.model.optimizer
            self.loss = keras.metrics.Mean(name="loss")
        # A model's own steps run as they are (steps.py); where they cannot, they are refused.
        self.custom_train = overrides(self.model, "train_step")
        self.custom_test = overrides(self.model, "test_step")
        self.train, train_steps = self.dataset(job.data_fn, "data", self.ctx)
        self._symbolic_build(self.train.element_spec)
        self.validation, val_steps = None, None
        if job.validation_fn is not None:
            self.validation, val_steps = self.dataset(
                job.validation_fn, "validation_data", self.val_ctx
            )
        return {
            "train_steps": train_steps,
            "validation_steps": val_steps,
            "parameters": int(sum(int(tf.size(v)) for v in self.model.trainable_variables)),
        }

    def dataset(
        self, fn: Callable[[InputContext], Any], what: str, ctx: InputContext
    ) -> tuple[tf.data.Dataset, int | None]:
        """The user's dataset for ``ctx``, checked and batched; its steps (None: unknown)."""
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
                f"The {what} dataset yields {describe_spec(spec)}, expected a tuple "
                "(features, labels) or (features, labels, sample_weight)."
            )
        self._check_features(spec[0], what)
        unit = self.unit(ctx)
        if what != "data" and self.job.validation_steps is None:
            # Every example, the last partial batch too, as Keras's evaluate: validation
            # metrics are then Keras's on the same data, whatever the layout.
            whole = ds.batch(unit)
            if int(whole.cardinality()) == tf.data.INFINITE_CARDINALITY:
                raise ConfigError(
                    f"The {what} dataset of worker {ctx.worker_index} repeats forever, so "
                    "raytf cannot tell where a validation pass ends; pass validation_steps=N "
                    "or drop the .repeat()."
                )
            return whole, WHOLE
        batched = ds.batch(unit, drop_remainder=True)
        if what == "data":
            batched = self.weighted(batched)
        cardinality = int(batched.cardinality())
        steps = cardinality // self.per_step if cardinality >= 0 else None
        if steps is not None and self.per_step > 1:
            # A pass ends on a whole step: with per-replica batches (mirrored), the batches
            # left over would be carried into the next epoch, which other layouts drop, and
            # epochs after the first would see other examples than in every other layout.
            batched = batched.take(steps * self.per_step)
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
                f"batch of {unit * self.per_step} (global batch {ctx.global_batch_size} "
                f"over {ctx.num_workers} worker(s)); use a smaller global_batch_size or more "
                "data."
            )
        return batched, steps

    def weighted(self, batched: tf.data.Dataset) -> tf.data.Dataset:
        """Batched training data with the job's class_weight as sample weights (if any)."""
        if self.job.class_weight is None:
            return batched
        return batched.map(class_weight_map(self.job.class_weight, batched.element_spec))

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
                f"{describe_spec(features)} but the model takes {len(want)} input(s) "
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
                    f"{describe_spec(element_spec)}. Keras said: {exc}"
                ) from exc
            if not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)

    def skipped(self, batches: int) -> tf.data.Dataset:
        """The repeated training data, ``batches`` steps on (where a checkpoint left it)."""
        skip = batches * self.per_step
        passes = int(self.train.cardinality())
        if passes > 0:  # a finite dataset repeats: skip within one pass, not through them all
            skip %= passes
        data = self.train.repeat()
        return data.skip(skip) if skip else data

    # ------------------------------------------------------------------ metrics
    def reset_metrics(self) -> None:
        for metric in [*self.model.metrics, self.loss]:
            metric.reset_state()

    def current_metrics(self, prefix: str = "") -> dict[str, float]:
        """The logs so far, as Keras names them, with ``prefix`` (``val_``: evaluation's).

        raytf's own steps track the loss apart; a model's own step reports what its
        metrics hold, as Keras' fit does.
        """
        logs = {k: float(v) for k, v in self.model.get_metrics_result().items()}
        own_step = self.custom_test if prefix else self.custom_train
        if not own_step:
            logs["loss"] = float(self.loss.result())
        return {prefix + k: v for k, v in logs.items()}

    def read_metrics(self, prefix: str = "") -> dict[str, float]:
        """The epoch's logs (then reset), as Keras names them, with ``prefix`` (``val_``)."""
        logs = self.current_metrics(prefix)
        self.reset_metrics()
        return logs

    # ------------------------------------------------------------------ result
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for w in self.model.get_weights():
            digest.update(w.tobytes())
        return digest.hexdigest()

    def final(self, with_model: bool) -> dict[str, Any]:
        """The fingerprint of the weights; with ``with_model``, the weights and a .keras file."""
        out: dict[str, Any] = {
            "fingerprint": self.fingerprint(),
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

"""One training or evaluation step, in each of the shapes raytf runs it, as plain functions.

- replica step: inside ``strategy.run`` (mirrored, multi-worker, a PS chief's closures);
- towers step: the worker batch split over devices in one graph, gradients averaged by hand;
- gradient step: forward and backward only, for parameter-server workers.
Each updates the loss tracker and the model's compiled metrics as Keras would. A model that
overrides ``train_step``/``test_step`` has its own step run instead, inside ``strategy.run``
as Keras' TensorFlow trainer runs it; the shapes that cannot run it refuse it by name.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from raytf._internal.worker.model import ModelData
from raytf.errors import ConfigError


def unpack(data: Any) -> tuple[Any, Any, Any]:
    if isinstance(data, (tuple, list)):
        if len(data) == 2:
            return data[0], data[1], None
        if len(data) == 3:
            return data[0], data[1], data[2]
    return data, None, None


def batch_size_of(x: Any) -> tf.Tensor:
    return tf.shape(tf.nest.flatten(x)[0])[0]


def compute_loss(md: ModelData, x: Any, y: Any, y_pred: Any, sw: Any, training: bool) -> Any:
    fn = getattr(md.model, "_compute_loss", None) or md.model.compute_loss
    return fn(x=x, y=y, y_pred=y_pred, sample_weight=sw, training=training)


def forward_backward(md: ModelData, x: Any, y: Any, sw: Any) -> tuple[Any, Any, list]:
    model = md.model
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = compute_loss(md, x, y, y_pred, sw, True)
        scaled = md.optimizer.scale_loss(loss)
    return y_pred, loss, tape.gradient(scaled, model.trainable_variables)


#: The layouts that run a model's own ``train_step``, for the refusals' messages.
RUNS_CUSTOM_STEP = (
    "InGraph(strategy='mirrored') (or 'auto', which picks it for such a model), a "
    "one-device InGraph, AllReduce, and ParameterServer(backend='tensorflow')"
)


def refuse_custom_train_step(md: ModelData, where: str, why: str) -> None:
    if md.custom_train:
        raise ConfigError(
            f"The model overrides train_step, which {where} cannot run: {why}. raytf never "
            f"skips a model's own step; use a layout that runs it: {RUNS_CUSTOM_STEP}."
        )


def replica_step(md: ModelData) -> Callable[[Any], None]:
    strategy = md.strategy
    if md.custom_train:  # the model's own step, as Keras' trainer runs it
        return lambda data: strategy.run(md.model.train_step, args=(data,))

    def step(data: Any) -> None:
        x, y, sw = unpack(data)
        y_pred, loss, grads = forward_backward(md, x, y, sw)
        md.optimizer.apply_gradients(zip(grads, md.model.trainable_variables))
        # Keras scaled the loss by 1/replicas for the gradient sum; report the mean.
        md.loss.update_state(loss * strategy.num_replicas_in_sync, sample_weight=batch_size_of(x))
        md.model.compute_metrics(x, y, y_pred, sample_weight=sw)

    return lambda data: strategy.run(step, args=(data,))


def towers_step(md: ModelData, devices: list[str]) -> Callable[[Any], None]:
    refuse_custom_train_step(
        md,
        "InGraph(strategy='towers')",
        "towers split each batch over devices and average the gradients themselves",
    )
    n = len(devices)

    def step(data: Any) -> None:
        x_all, y_all, sw_all = unpack(data)
        # Split every tensor of the batch (nested features, labels, weights) n ways.
        batch = (x_all, y_all) if sw_all is None else (x_all, y_all, sw_all)
        splits = [tf.split(t, n, axis=0) for t in tf.nest.flatten(batch)]
        tower_grads = []
        for i, device in enumerate(devices):
            x, y, sw = unpack(tf.nest.pack_sequence_as(batch, [s[i] for s in splits]))
            with tf.device(device):
                y_pred, loss, grads = forward_backward(md, x, y, sw)
            tower_grads.append(grads)
            md.loss.update_state(loss, sample_weight=batch_size_of(x))
            md.model.compute_metrics(x, y, y_pred, sample_weight=sw)
        averaged = []
        for per_var in zip(*tower_grads):
            if per_var[0] is None:
                averaged.append(None)
            else:
                averaged.append(tf.add_n([tf.convert_to_tensor(g) for g in per_var]) / n)
        md.optimizer.apply_gradients(zip(averaged, md.model.trainable_variables))

    return step


def eval_step(md: ModelData, replicated: bool) -> Callable[[Any], None]:
    """One evaluation batch; ``replicated``: inside ``strategy.run`` on every replica."""
    scale = md.strategy.num_replicas_in_sync if replicated else 1
    if md.custom_test:  # the model's own step, as Keras' trainer runs it
        if replicated:
            return lambda data: md.strategy.run(md.model.test_step, args=(data,))
        return md.model.test_step

    def one(data: Any) -> None:
        x, y, sw = unpack(data)
        y_pred = md.model(x, training=False)
        loss = compute_loss(md, x, y, y_pred, sw, False)
        md.loss.update_state(loss * scale, sample_weight=batch_size_of(x))
        md.model.compute_metrics(x, y, y_pred, sample_weight=sw)

    if replicated:
        return lambda data: md.strategy.run(one, args=(data,))
    return one


def loop_of(step: Callable[[Any], Any]) -> Callable[[Any, tf.Tensor], tf.Tensor]:
    """``n`` steps on ``iterator`` in one ``tf.function`` call (steps_per_execution)."""

    @tf.function
    def run_n(iterator: Any, n: tf.Tensor) -> tf.Tensor:
        for _ in tf.range(n):
            step(next(iterator))  # a model's own step returns logs: metrics carry them
        return n

    return run_n


def loop_all(step: Callable[[Any], Any]) -> Callable[[Any], tf.Tensor]:
    """``step`` on every batch of ``dataset`` (distributed or not) in one ``tf.function``:
    under a strategy, replicas or workers left without data take empty batches."""

    @tf.function
    def run_all(dataset: Any) -> tf.Tensor:
        for batch in dataset:
            step(batch)
        return tf.constant(0)

    return run_all


class StepClock:
    """When the first step finished, and the steady rate after it (tracing excluded)."""

    def __init__(self) -> None:
        self.first_step_at: float | None = None
        self.steps = 0
        self.seconds = 0.0

    @property
    def warm(self) -> bool:
        return self.first_step_at is not None

    def record(self, steps: int, started: float) -> None:
        """``steps`` just ran since ``started`` (perf_counter); the first call is tracing."""
        if self.first_step_at is None:
            self.first_step_at = time.time()  # wall clock: the driver compares with its own
        else:
            self.steps += steps
            self.seconds += time.perf_counter() - started

    def throughput(self, batch: int) -> float | None:
        """Examples/second after the first (tracing) call, ``batch`` examples a step."""
        return self.steps * batch / self.seconds if self.seconds else None

"""The worker half of raytf's parameter-server backend: gradients, not updates.

The model, data and metrics are raytf's (worker/model.py); what changes is the step. A worker
assigns the weights it pulled, runs forward and backward, and returns the gradients (and the
new values of float non-trainable variables such as BatchNorm statistics) for the servers to
apply. The optimizer lives on the servers. Imports TensorFlow: only worker actors load it.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from raytf._internal.job import Job
from raytf._internal.spec import StrategySpec
from raytf._internal.worker import steps as S
from raytf._internal.worker.model import WHOLE, ModelData
from raytf.data import InputContext


def shared_variables(model: keras.Model) -> tuple[list[Any], list[Any]]:
    """(trainable, float non-trainable) variables: what the servers own, in a fixed order.

    Integer state (seed generators) stays with each worker: it is per-process randomness.
    """
    extras = [v for v in model.non_trainable_variables if keras.backend.is_float_dtype(v.dtype)]
    return list(model.trainable_variables), extras


class GradientStep:
    """One worker's model and data, stepping to gradients on the servers' weights.

    Transfer is flat: one float32 buffer per server each way (that server's weights in, its
    gradients and non-trainable values out), split and reshaped inside the tf.function, so a
    step pays one conversion per server rather than one per variable.
    """

    def __init__(self, spec: StrategySpec, job: Job) -> None:
        ctx = InputContext(
            worker_index=spec.worker_index,
            num_workers=spec.num_workers,
            replicas_per_worker=1,
            global_batch_size=job.global_batch_size,
            seed=job.seed,
        )
        val_ctx = InputContext(**{**ctx.__dict__, "training": False})
        self.md = ModelData(job, tf.distribute.get_strategy(), ctx, val_ctx, False, 1)
        self.clock = S.StepClock()

    def build(self) -> dict[str, Any]:
        info = self.md.build()
        S.refuse_custom_train_step(
            self.md,
            "ParameterServer(backend='ray')",
            "its workers compute the gradients and the servers apply them, so no one process "
            "runs the whole step",
        )
        self.trainable, self.extras = shared_variables(self.md.model)
        self.shared = self.trainable + self.extras
        evaluate = S.eval_step(self.md, replicated=False)
        self._eval_n, self._eval_all = S.loop_of(evaluate), S.loop_all(evaluate)
        self._val = None
        if self.md.validation is not None:
            self._val = self.md.validation.repeat().prefetch(tf.data.AUTOTUNE)
        self.seek(0)
        return info

    def seek(self, batches: int) -> None:
        self._iterator = iter(self.md.skipped(batches).prefetch(tf.data.AUTOTUNE))

    def variables_info(self) -> list[dict[str, Any]]:
        """Name, value and kind of every shared variable: the servers' starting point."""
        return [
            {"name": v.path, "value": np.asarray(v.numpy()), "trainable": i < len(self.trainable)}
            for i, v in enumerate(self.shared)
        ]

    def connect(self, owner: list[int], servers: int) -> None:
        """Group the shared variables by server: ``owner[i]`` holds ``shared[i]``.

        Mixed precision: the loss scale is the server's (one server: a LossScaleOptimizer
        cannot be sharded). It arrives as the last value of server 0's buffer, the worker
        scales its loss by it, and sends it back after its gradients, so the server unscales
        each gradient by the scale it was computed with, and only the server adjusts it.
        """
        md, shared, trainable = self.md, self.shared, self.trainable
        n_trainable = len(trainable)
        groups = [[i for i, o in enumerate(owner) if o == s] for s in range(servers)]
        scaled = isinstance(md.optimizer, keras.optimizers.LossScaleOptimizer)

        def unflatten(flats: list[tf.Tensor]) -> None:
            for s, (flat, group) in enumerate(zip(flats, groups)):
                sizes = [int(np.prod(shared[i].shape)) for i in group]
                with_scale = scaled and s == 0
                parts = tf.split(flat, [*sizes, 1] if with_scale else sizes)
                for i, part in zip(group, parts):
                    var = shared[i]
                    var.assign(tf.cast(tf.reshape(part, var.shape), var.dtype))
                if with_scale:
                    md.optimizer.dynamic_scale.assign(tf.reshape(parts[-1], []))

        @tf.function
        def grad_step(flats: list[tf.Tensor], iterator: Any) -> list[tf.Tensor]:
            unflatten(flats)
            x, y, sw = S.unpack(next(iterator))
            y_pred, loss, grads = S.forward_backward(md, x, y, sw)
            md.loss.update_state(loss, sample_weight=S.batch_size_of(x))
            md.model.compute_metrics(x, y, y_pred, sample_weight=sw)
            out = []
            for group in groups:
                pieces = []
                for i in group:
                    if i < n_trainable:
                        g = grads[i]
                        value = tf.zeros_like(trainable[i].value) if g is None else g
                    else:
                        value = shared[i].value
                    pieces.append(tf.reshape(tf.cast(value, tf.float32), [-1]))
                out.append(tf.concat(pieces, axis=0))
            if scaled:  # the scale these gradients were computed with
                scale = tf.cast(md.optimizer.dynamic_scale.value, tf.float32)
                out[0] = tf.concat([out[0], tf.reshape(scale, [1])], axis=0)
            return out

        @tf.function
        def assign(flats: list[tf.Tensor]) -> None:
            unflatten(flats)

        self._grad_step = grad_step
        self._assign = assign

    def gradients(self, flats: list[np.ndarray]) -> list[np.ndarray]:
        """One step on the next batch at the servers' weights: per server, a flat buffer of
        its variables' gradients followed by its non-trainable variables' new values."""
        return [t.numpy() for t in self._grad_step(flats, self._iterator)]

    def assign(self, flats: list[np.ndarray]) -> None:
        self._assign(flats)

    def evaluate(self, validation_steps: int) -> dict[str, float]:
        if validation_steps == WHOLE:
            self._eval_all(self.md.validation).numpy()
        else:
            self._eval_n(iter(self._val), tf.constant(validation_steps)).numpy()
        # The examples this worker's shard held: the driver weighs the shards' logs by them.
        self.val_examples = None if self.md.custom_test else float(self.md.loss.count.numpy())
        return self.md.read_metrics("val_")

"""The worker half of raytf's parameter-server engine: gradients, not updates.

The model, data and metrics are the raytf engine's; what changes is the step. A worker assigns
the weights it pulled, runs forward and backward, and returns the gradients (and the new
values of float non-trainable variables such as BatchNorm statistics) for the servers to apply.
The optimizer lives on the servers. Imports TensorFlow: only worker actors load this module.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from raytf._internal.engine import Engine, _batch_size_of, _unpack


def shared_variables(model: keras.Model) -> tuple[list[Any], list[Any]]:
    """(trainable, float non-trainable) variables: what the servers own, in a fixed order.

    Integer state (seed generators) stays with each worker: it is per-process randomness.
    """
    extras = [v for v in model.non_trainable_variables if keras.backend.is_float_dtype(v.dtype)]
    return list(model.trainable_variables), extras


class PSEngine(Engine):
    """A raytf Engine whose step returns gradients instead of applying them."""

    def build(self) -> dict[str, Any]:
        info = super().build()
        self.trainable, self.extras = shared_variables(self.model)
        self.shared = self.trainable + self.extras
        trainable, extras = self.trainable, self.extras

        @tf.function
        def grad_step(weights: list[tf.Tensor], iterator: Any) -> tuple[list, list]:
            for var, value in zip(self.shared, weights):
                var.assign(value)
            x, y, sw = _unpack(next(iterator))
            y_pred, loss, grads = self._forward_backward(x, y, sw)
            self._loss.update_state(loss, sample_weight=_batch_size_of(x))
            self.model.compute_metrics(x, y, y_pred, sample_weight=sw)
            grads = [
                tf.zeros_like(v.value) if g is None else tf.convert_to_tensor(g)
                for g, v in zip(grads, trainable)
            ]
            return grads, [tf.identity(v.value) for v in extras]

        self._grad_step = grad_step
        return info

    def variables_info(self) -> list[dict[str, Any]]:
        """Name, value and kind of every shared variable: the servers' starting point."""
        return [
            {"name": v.path, "value": np.asarray(v.numpy()), "trainable": i < len(self.trainable)}
            for i, v in enumerate(self.shared)
        ]

    def gradients(self, weights: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """One step on the next batch at ``weights``: (gradients, non-trainable values)."""
        grads, extras = self._grad_step(weights, self._iterator)
        return [g.numpy() for g in grads], [e.numpy() for e in extras]

    def assign(self, weights: list[np.ndarray]) -> None:
        for var, value in zip(self.shared, weights):
            var.assign(value)

    def evaluate(self, validation_steps: int) -> dict[str, float]:
        self._eval_n(iter(self._val_data), tf.constant(validation_steps)).numpy()
        return self._read_metrics("val_")

    def reset_metrics(self) -> None:
        for metric in [*self.model.metrics, self._loss]:
            metric.reset_state()

    def read_metrics(self) -> dict[str, float]:
        return self._read_metrics()

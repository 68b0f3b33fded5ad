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
    """A raytf Engine whose step returns gradients instead of applying them.

    Transfer is flat: one float32 buffer per server each way (that server's weights in, its
    gradients and non-trainable values out), split and reshaped inside the tf.function, so a
    step pays one conversion per server rather than one per variable.
    """

    def build(self) -> dict[str, Any]:
        info = super().build()
        self.trainable, self.extras = shared_variables(self.model)
        self.shared = self.trainable + self.extras
        return info

    def connect(self, owner: list[int], servers: int) -> None:
        """Group the shared variables by server: ``owner[i]`` holds ``shared[i]``."""
        n_trainable = len(self.trainable)
        self.groups = [[i for i, o in enumerate(owner) if o == s] for s in range(servers)]
        shared, trainable = self.shared, self.trainable
        groups = self.groups

        def unflatten(flats: list[tf.Tensor]) -> None:
            for flat, group in zip(flats, groups):
                sizes = [int(np.prod(shared[i].shape)) for i in group]
                for i, part in zip(group, tf.split(flat, sizes)):
                    var = shared[i]
                    var.assign(tf.cast(tf.reshape(part, var.shape), var.dtype))

        @tf.function
        def grad_step(flats: list[tf.Tensor], iterator: Any) -> list[tf.Tensor]:
            unflatten(flats)
            x, y, sw = _unpack(next(iterator))
            y_pred, loss, grads = self._forward_backward(x, y, sw)
            self._loss.update_state(loss, sample_weight=_batch_size_of(x))
            self.model.compute_metrics(x, y, y_pred, sample_weight=sw)
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
            return out

        @tf.function
        def assign(flats: list[tf.Tensor]) -> None:
            unflatten(flats)

        self._grad_step = grad_step
        self._assign = assign

    def variables_info(self) -> list[dict[str, Any]]:
        """Name, value and kind of every shared variable: the servers' starting point."""
        return [
            {"name": v.path, "value": np.asarray(v.numpy()), "trainable": i < len(self.trainable)}
            for i, v in enumerate(self.shared)
        ]

    def gradients(self, flats: list[np.ndarray]) -> list[np.ndarray]:
        """One step on the next batch at the servers' weights: per server, a flat buffer of
        its variables' gradients followed by its non-trainable variables' new values."""
        return [t.numpy() for t in self._grad_step(flats, self._iterator)]

    def assign(self, flats: list[np.ndarray]) -> None:
        self._assign(flats)

    def evaluate(self, validation_steps: int) -> dict[str, float]:
        self._eval_n(iter(self._val_data), tf.constant(validation_steps)).numpy()
        return self._read_metrics("val_")

    def reset_metrics(self) -> None:
        for metric in [*self.model.metrics, self._loss]:
            metric.reset_state()

    def read_metrics(self) -> dict[str, float]:
        return self._read_metrics()

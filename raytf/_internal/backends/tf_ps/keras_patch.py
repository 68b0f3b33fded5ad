"""Keras 3 implements ``assign_add`` as ``assign(self + x)``: two workers updating one metric
under ParameterServerStrategy lose updates (accuracy above 1 was measured). The chief of
TensorFlow's parameter-server backend, and only it, makes it TensorFlow's atomic op."""

from __future__ import annotations

from typing import Any


def atomic_keras_assign_add() -> None:
    """Patch Keras' TensorFlow Variable in this process (idempotent)."""
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

"""The actor behind :func:`raytf.evaluate` and :func:`raytf.predict`: one shard of the data
through a ``.keras`` model, in batches that keep the last partial one.

Evaluation runs the model's own ``test_step`` (Keras's, or the model's override), so the
loss and metrics update as ``model.evaluate`` updates them; the shards' metric variables are
then merged by each variable's aggregation (totals and counts add up), which makes the result
Keras's ``evaluate`` over all the data, whatever the split.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from raytf._internal.worker.process import Process, surface_errors


class Scorer:
    """One scoring actor. A plain class made an actor at spawn."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc = Process(name)

    @surface_errors
    def load(self, model_bytes: bytes) -> None:
        import keras
        import tensorflow as tf

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.keras")
            with open(path, "wb") as f:
                f.write(model_bytes)
            self.model = keras.models.load_model(path)
        self.test_step = tf.function(self.model.test_step)
        self.predict_step = tf.function(lambda x: self.model(x, training=False))

    def _batches(self, data_fn: Any, ctx: Any, batch_size: int) -> Any:
        return data_fn(ctx).batch(batch_size)  # the last partial batch too, as Keras does

    @surface_errors
    def evaluate(self, data_fn: Any, ctx: Any, batch_size: int) -> list[Any]:
        """This shard's metric variables (model.metrics order), after every batch."""
        model = self.model
        if not model.compiled:
            from raytf.errors import ConfigError

            raise ConfigError(
                "raytf.evaluate needs a compiled model (its loss and metrics); the .keras file "
                "holds an uncompiled one. Compile it in the model function you trained with."
            )
        for metric in model.metrics:
            metric.reset_state()
        seen = 0
        for batch in self._batches(data_fn, ctx, batch_size):
            self.test_step(batch)
            seen += 1
        if not seen:
            return []
        return [[(v.aggregation, v.numpy()) for v in m.variables] for m in model.metrics]

    @surface_errors
    def merge(self, states: list[list[Any]]) -> dict[str, float]:
        """The metrics of every shard's ``states`` together (shards with no rows send [])."""
        import numpy as np

        states = [s for s in states if s]
        for i, metric in enumerate(self.model.metrics):
            for j, variable in enumerate(metric.variables):
                values = [s[i][j][1] for s in states]
                aggregation = states[0][i][j][0]
                if aggregation == "mean":
                    merged = np.mean(values, axis=0)
                elif aggregation == "only_first_replica":
                    merged = values[0]
                else:  # "sum", and what metrics count (totals, counts, confusion entries)
                    merged = np.sum(values, axis=0)
                variable.assign(merged)
        return {k: float(v) for k, v in self.model.get_metrics_result().items()}

    @surface_errors
    def predict(self, data_fn: Any, ctx: Any, batch_size: int) -> Any:
        """Predictions for this shard's rows, in its order (numpy, or a structure of them)."""
        import numpy as np
        import tensorflow as tf

        outputs = []
        for batch in self._batches(data_fn, ctx, batch_size):
            x = batch[0] if isinstance(batch, tuple) else batch
            outputs.append(tf.nest.map_structure(np.asarray, self.predict_step(x)))
        if not outputs:
            return None
        return tf.nest.map_structure(lambda *parts: np.concatenate(parts), *outputs)

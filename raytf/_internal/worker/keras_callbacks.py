"""Keras callbacks inside raytf's loop: where each kind runs, and how its decisions go global.

Keras under MultiWorkerMirroredStrategy runs every callback on every worker; raytf does too,
with two rules that make each decision one decision:

- writers (ModelCheckpoint, CSVLogger, TensorBoard, ProgbarLogger, RemoteMonitor, History)
  run on the chief alone, so each file is written once, to the user's path;
- every other callback (EarlyStopping, LearningRateScheduler, ReduceLROnPlateau,
  TerminateOnNaN, LambdaCallback, your own) runs on every worker and sees the global epoch
  logs, so every worker decides alike; the driver still ORs ``stop_training`` and makes the
  chief's learning rate every worker's and every parameter server's, between epochs.

BackupAndRestore is refused: raytf's ``checkpoint_dir`` and ``FailurePolicy`` restore every
worker at once, where a chief-only backup would leave the replicas apart. After the run the
chief's callback state (``History.history``, ``EarlyStopping.stopped_epoch``, ...) is copied
into the user's own objects, so they read as they would after ``model.fit``.

This module is imported by the driver too: it imports Keras only where a worker runs it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from raytf.errors import ConfigError

WRITERS = frozenset(
    {"ModelCheckpoint", "CSVLogger", "TensorBoard", "ProgbarLogger", "RemoteMonitor", "History"}
)
REFUSED = {
    "BackupAndRestore": (
        "raytf restores every worker from checkpoint_dir= when a FailurePolicy allows "
        "failures (raytf.FailurePolicy(max_failures=...)); a Keras backup restores one "
        "process. Drop BackupAndRestore and pass checkpoint_dir= and failures= to raytf.fit"
    ),
}
#: Attributes not copied back into the user's callbacks: the worker's model and writers.
_PRIVATE = frozenset({"model", "_model"})


def _keras_names(obj: Any) -> list[str]:
    """Names of the Keras classes ``obj`` is an instance of (Keras is not imported here)."""
    return [c.__name__ for c in type(obj).__mro__ if c.__module__.startswith("keras")]


def is_keras_callback(obj: Any) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(obj, keras.callbacks.Callback)


def chief_only(callback: Any) -> bool:
    return bool(WRITERS.intersection(_keras_names(callback)))


def check(callbacks: Sequence[Any]) -> None:
    """Refuse, before anything starts, the Keras callbacks raytf replaces."""
    for cb in callbacks:
        for name in _keras_names(cb):
            if name in REFUSED:
                raise ConfigError(
                    f"callbacks: keras.callbacks.{name} is not run by raytf: {REFUSED[name]}."
                )


def copy_back(
    originals: Sequence[Any],
    states: Sequence[dict[str, Any] | None],
    history: dict[str, list[float]],
    epochs: list[int],
) -> None:
    """Give the user's callback objects the state the chief's copies ended with. A History
    gets the run's whole record (the chief's copy saw only the epochs since a recovery)."""
    for cb, state in zip(originals, states):
        if state:
            cb.__dict__.update(state)
        if "History" in _keras_names(cb):
            cb.epoch = list(epochs)
            cb.history = {
                k: list(v)
                for k, v in history.items()
                if k not in ("examples_per_second", "throughput")
            }


def _picklable_state(callback: Any) -> dict[str, Any]:
    import ray.cloudpickle as pickle

    out = {}
    for key, value in vars(callback).items():
        if key in _PRIVATE:
            continue
        try:
            pickle.dumps(value)
        except Exception:  # writers, locks, file handles: the worker's alone
            continue
        out[key] = value
    return out


class KerasHooks:
    """One worker's Keras callbacks over its ``model``; the chief runs the writers too.

    Batch hooks run once per executed block of ``steps_per_execution`` steps, as in Keras,
    and only when a callback implements one (reading the running logs costs a sync).
    """

    def __init__(
        self,
        callbacks: Sequence[Any],
        model: Any,
        is_chief: bool,
        epochs: int,
        steps: int | None,
        resumed: bool = False,
    ) -> None:
        self.model = model
        self.all = list(callbacks)
        self.mine = [is_chief or not chief_only(cb) for cb in self.all]
        self.callbacks = [cb for cb, run in zip(self.all, self.mine) if run]
        for cb in self.callbacks:
            cb.set_model(model)
            cb.set_params({"verbose": 0, "epochs": epochs, "steps": steps})
            if resumed and "CSVLogger" in _keras_names(cb):
                cb.append = True  # a resumed run goes on with the rows it wrote
        # Over every callback, not this worker's: batch hooks read the metrics and agree on
        # stop_training collectively, so every worker must do it alike.
        self.batch_hooks = any(uses_batch_hooks(cb) for cb in self.all)

    def _call(self, hook: str, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(*args)

    @property
    def stop(self) -> bool:
        return bool(getattr(self.model, "stop_training", False))

    def train_begin(self) -> None:
        self.model.stop_training = False
        self._call("on_train_begin", {})

    def epoch_begin(self, epoch: int) -> None:
        self._call("on_epoch_begin", epoch, {})

    def batch_begin(self, step: int) -> None:
        if self.batch_hooks:
            self._call("on_train_batch_begin", step, {})

    def batch_end(self, step: int, logs: dict[str, float] | None) -> None:
        if self.batch_hooks:
            self._call("on_train_batch_end", step, logs)

    def test_begin(self) -> None:
        self._call("on_test_begin", {})

    def test_end(self, logs: dict[str, float]) -> None:
        self._call("on_test_end", dict(logs))

    def epoch_end(self, epoch: int, logs: dict[str, float]) -> dict[str, float]:
        """The hooks on the epoch's global logs; the logs they return (Keras' callbacks add
        ``learning_rate``, for example)."""
        logs = dict(logs)
        self._call("on_epoch_end", epoch, logs)
        return {k: float(v) for k, v in logs.items()}

    def train_end(self, logs: dict[str, float] | None) -> None:
        self._call("on_train_end", dict(logs or {}))

    # ------------------------------------------------------------ the learning rate
    def learning_rate(self) -> float | None:
        return plain_learning_rate(getattr(self.model, "optimizer", None))

    def set_learning_rate(self, value: float) -> None:
        self.model.optimizer.learning_rate = value

    def states(self) -> list[dict[str, Any] | None]:
        """Per callback given to fit, the state of this worker's copy (None: not run here)."""
        out: list[dict[str, Any] | None] = []
        for cb, run in zip(self.all, self.mine):
            out.append(_picklable_state(cb) if run else None)
        return out


def plain_learning_rate(optimizer: Any) -> float | None:
    """The optimizer's learning rate, if it is a value callbacks may set; None for a
    schedule or a callable (it lives in the optimizer, with its step count, everywhere)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # mixed precision
    if callable(getattr(inner, "_learning_rate", None)):  # schedules are callables too
        return None
    try:
        return float(optimizer.learning_rate)
    except (AttributeError, TypeError, ValueError):
        return None


def _overridden(callback: Any, hook: str) -> bool:
    """Whether ``hook`` does something: a subclass's method, or a function set on the
    instance (LambdaCallback)."""
    import keras

    method = getattr(callback, hook)
    return getattr(method, "__func__", None) is not getattr(keras.callbacks.Callback, hook)


def uses_batch_hooks(callback: Any) -> bool:
    """Whether ``callback`` acts between batches (writers that only write per epoch do not)."""
    names = _keras_names(callback)
    if "ModelCheckpoint" in names and getattr(callback, "save_freq", None) == "epoch":
        return False
    if (
        "TensorBoard" in names
        and getattr(callback, "update_freq", None) == "epoch"
        and not getattr(callback, "_should_trace", False)
    ):
        return False
    hooks = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
    return any(_overridden(callback, hook) for hook in hooks)

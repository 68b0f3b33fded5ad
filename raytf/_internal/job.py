"""The validated description of one training job, sent to every worker actor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raytf._internal.checks import non_negative_int, positive_int
from raytf.errors import ConfigError


@dataclass(frozen=True)
class Job:
    """Everything a worker needs to train, validated at construction (before any actor starts)."""

    model_fn: Callable[[], Any]
    data_fn: Callable[[Any], Any]
    global_batch_size: int
    epochs: int = 1
    validation_fn: Callable[[Any], Any] | None = None
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    loss: Any = None
    optimizer: Any = None
    metrics: tuple[Any, ...] = ()
    steps_per_execution: int | str = "auto"
    seed: int | None = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    resume: bool = False
    #: How many checkpoints each directory keeps (the newest ones).
    keep_checkpoints: int = 3
    #: A checkpoint at the last epoch ends the run untrained, not as an error: a Tune trial
    #: that PBT pointed at a finished trial's checkpoint has nothing left to do.
    finished_ok: bool = False
    #: keras.callbacks.Callback objects, run in the workers (see worker/keras_callbacks.py).
    keras_callbacks: tuple[Any, ...] = ()
    #: Keras' meanings: {class: weight} for the training loss; validate every N epochs;
    #: the epoch to start counting from.
    class_weight: dict[int, float] | None = None
    validation_freq: int = 1
    initial_epoch: int = 0

    def __post_init__(self) -> None:
        if not callable(self.model_fn):
            raise ConfigError(
                f"model must be a function that builds a keras.Model, received "
                f"{type(self.model_fn).__name__}. Pass the builder, e.g. model=build_model, "
                "not model=build_model(): raytf builds it inside each worker's strategy scope."
            )
        if not callable(self.data_fn):
            raise ConfigError(
                f"data must be a function (InputContext) -> tf.data.Dataset, received "
                f"{type(self.data_fn).__name__}. Wrap your dataset: data=lambda ctx: ds."
            )
        if self.validation_fn is not None and not callable(self.validation_fn):
            raise ConfigError(
                f"validation_data must be a function (InputContext) -> tf.data.Dataset, "
                f"received {type(self.validation_fn).__name__}."
            )
        positive_int("global_batch_size", self.global_batch_size, "For example 256.")
        positive_int("epochs", self.epochs, "For example epochs=5.")
        positive_int("checkpoint_every", self.checkpoint_every, "It counts epochs.")
        positive_int("keep_checkpoints", self.keep_checkpoints, "The newest N are kept.")
        for name in ("steps_per_epoch", "validation_steps"):
            positive_int(name, getattr(self, name), "None uses the whole dataset.", allow_none=True)
        spe = self.steps_per_execution
        if spe != "auto":
            positive_int("steps_per_execution", spe, "Or 'auto'.")
        if self.resume and not self.checkpoint_dir:
            raise ConfigError(
                "resume=True needs checkpoint_dir= naming the directory to resume from."
            )
        positive_int("validation_freq", self.validation_freq, "It counts epochs, as in Keras.")
        non_negative_int("initial_epoch", self.initial_epoch, "It counts epochs, as in Keras.")
        if self.initial_epoch >= self.epochs:
            raise ConfigError(
                f"initial_epoch={self.initial_epoch} leaves nothing to train with "
                f"epochs={self.epochs}: as in Keras, epochs is the index of the last epoch, "
                f"so pass epochs > initial_epoch (e.g. epochs={self.initial_epoch + 1})."
            )
        check_class_weight(self.class_weight)
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed must be an int or None, received {self.seed!r}.")

    def validates(self, epoch: int) -> bool:
        """Whether ``epoch`` (from 0) ends with validation: every ``validation_freq``-th."""
        return self.validation_fn is not None and (epoch + 1) % self.validation_freq == 0


def check_class_weight(class_weight: Any) -> None:
    if class_weight is None:
        return
    ok = isinstance(class_weight, dict) and class_weight
    ok = ok and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in class_weight)
    ok = ok and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
        for v in class_weight.values()
    )
    if not ok:
        raise ConfigError(
            f"class_weight must map class indices (ints >= 0) to weights (numbers >= 0), "
            f"received {class_weight!r}; for example class_weight={{0: 1.0, 1: 5.0}}."
        )


def check_batch_split(global_batch_size: int, replicas: int) -> None:
    """The global batch must split exactly over the replicas; say how to fix it if not."""
    if global_batch_size % replicas:
        lower = global_batch_size // replicas * replicas
        upper = lower + replicas
        options = f"{lower} or {upper}" if lower else f"{upper}"
        raise ConfigError(
            f"global_batch_size={global_batch_size} cannot be split evenly over {replicas} "
            f"replicas; use a multiple of {replicas}, such as {options}."
        )

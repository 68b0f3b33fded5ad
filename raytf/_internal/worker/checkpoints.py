"""A worker's checkpoints and TensorBoard scalars.

Every worker saves (distributed variables are read collectively), but only the chief's copy
is kept; the others write to a scratch directory they delete. Checkpoints are numbered by
global step, so mid-epoch and epoch-end ones sort in order, and hold (epoch, step) so a
restore goes on exactly where the checkpoint was written.

A checkpoint also holds the learning rate the model builder gave the run that wrote it. When
the builder now gives another (Population Based Training explored a new ``lr``), the new rate
is kept after the restore; otherwise the checkpoint's (a callback may have lowered it) wins.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import tensorflow as tf

from raytf.errors import ConfigError

KEEP = 3
#: The checkpoint key of the builder's learning rate.
RATE = "built_learning_rate"


class Checkpoints:
    """``model`` and ``optimizer`` (plus any named trackables) under ``directory``."""

    def __init__(
        self,
        directory: str | None,
        is_chief: bool,
        worker_index: int,
        keep: int = KEEP,
        **trackables: Any,
    ) -> None:
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="raytf_epoch")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="raytf_step")
        self.is_chief = is_chief
        self.restored: str | None = None
        self.skipped: list[str] = []
        self.manager: tf.train.CheckpointManager | None = None
        self.summaries: Any = None
        self.directory = directory
        if not directory:
            return
        self.rate = BuiltRate(trackables.get("optimizer"))
        self.checkpoint = tf.train.Checkpoint(
            epoch=self.epoch, step=self.step, **{RATE: self.rate.variable}, **trackables
        )
        # Restored without the rate (read on its own), so checkpoints written before it
        # existed still match the model.
        self.restorer = tf.train.Checkpoint(epoch=self.epoch, step=self.step, **trackables)
        if is_chief:  # TensorBoard scalars, one point per epoch
            # tensorboardX (a Ray Tune dependency): tensorflow-cpu ships without TensorBoard.
            from tensorboardX import SummaryWriter

            self.summaries = SummaryWriter(os.path.join(directory, "summaries"))
        own = directory if is_chief else os.path.join(directory, f".scratch-worker-{worker_index}")
        self.manager = tf.train.CheckpointManager(self.checkpoint, own, max_to_keep=keep)

    def restore(self) -> tuple[int, int]:
        """Restore the newest readable checkpoint: (epoch, step in epoch) to go on from."""
        if self.manager is None:
            return 0, 0
        self.restored, self.skipped = restore_newest_valid(self.restorer, self.directory)
        if self.restored is None:
            return 0, 0
        self.rate.after_restore(self.restored)
        return int(self.epoch.numpy()), int(self.step.numpy())

    def save(self, epoch: int, step: int, number: int) -> str | None:
        """A checkpoint at ``step`` of ``epoch`` (0 of the next: an epoch's end), numbered
        ``number``; the chief's path, None elsewhere (or without a directory)."""
        if self.manager is None:
            return None
        self.epoch.assign(epoch)
        self.step.assign(step)
        path = self.manager.save(checkpoint_number=number)
        if not self.is_chief:
            shutil.rmtree(self.manager.directory, ignore_errors=True)
            return None
        return path

    def write_scalars(self, logs: dict[str, float], epoch: int) -> None:
        if self.summaries is not None:
            for key, value in logs.items():
                self.summaries.add_scalar(key, value, global_step=epoch + 1)
            self.summaries.flush()


class BuiltRate:
    """The builder's learning rate, saved with the optimizer; see the module docstring."""

    def __init__(self, optimizer: Any) -> None:
        from raytf._internal.worker.keras_callbacks import plain_learning_rate

        self.optimizer = optimizer
        self.built = plain_learning_rate(optimizer)
        value = float("nan") if self.built is None else self.built
        self.variable = tf.Variable(value, dtype=tf.float64, trainable=False, name="raytf_lr")

    def after_restore(self, path: str) -> None:
        """``path`` was restored (without the rate): keep the builder's if it is new."""
        try:
            saved = float(tf.train.load_variable(path, f"{RATE}/.ATTRIBUTES/VARIABLE_VALUE"))
        except (tf.errors.NotFoundError, ValueError):  # written before raytf saved the rate
            return
        if self.built is not None and saved == saved and abs(saved - self.built) > 1e-12:
            self.optimizer.learning_rate = self.built  # a new rate from the builder: keep it


def restore_newest_valid(
    ckpt: tf.train.Checkpoint, directory: str | None
) -> tuple[str | None, list]:
    """Restore the newest checkpoint in ``directory`` that reads back whole.

    A checkpoint cut short by a crash (truncated or corrupt files: TensorFlow checks every
    tensor's checksum) is skipped for the one before it. One that does not match the model is
    a user error and raised. Returns (path restored or None, [skipped paths with the reason]).
    """
    state = tf.train.get_checkpoint_state(directory) if directory else None
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

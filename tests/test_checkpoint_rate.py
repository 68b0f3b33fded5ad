"""The learning rate after a restore: the checkpoint's, unless the builder's changed (PBT)."""

from __future__ import annotations

import pytest
import workloads


def built(lr: float):
    model = workloads.mlp(lr)
    model.optimizer.build(model.trainable_variables)
    return model


def restored_rate(directory: str, builder_lr: float) -> float:
    from raytf._internal.worker.checkpoints import Checkpoints

    model = built(builder_lr)
    checkpoints = Checkpoints(directory, True, 0, model=model, optimizer=model.optimizer)
    assert checkpoints.restore() == (1, 0)
    return float(model.optimizer.learning_rate)


def test_restore_keeps_the_checkpoints_rate_unless_the_builder_gives_another(tmp_path):
    from raytf._internal.worker.checkpoints import Checkpoints

    model = built(0.01)
    writer = Checkpoints(str(tmp_path), True, 0, model=model, optimizer=model.optimizer)
    model.optimizer.learning_rate = 0.004  # a callback (ReduceLROnPlateau) lowered it
    writer.save(1, 0, 1)
    # A retry with the same builder goes on at the lowered rate, as the run would have.
    assert restored_rate(str(tmp_path), 0.01) == pytest.approx(0.004)
    # PBT explored lr=0.05 for the clone: the builder's new rate wins over the checkpoint's.
    assert restored_rate(str(tmp_path), 0.05) == pytest.approx(0.05)


def test_a_checkpoint_written_before_the_rate_was_saved_still_restores(tmp_path):
    import tensorflow as tf

    model = built(0.01)
    model.optimizer.learning_rate = 0.002
    old = tf.train.Checkpoint(  # what raytf wrote before it saved the builder's rate
        epoch=tf.Variable(1, dtype=tf.int64),
        step=tf.Variable(0, dtype=tf.int64),
        model=model,
        optimizer=model.optimizer,
    )
    tf.train.CheckpointManager(old, str(tmp_path), max_to_keep=1).save(checkpoint_number=1)
    assert restored_rate(str(tmp_path), 0.01) == pytest.approx(0.002)

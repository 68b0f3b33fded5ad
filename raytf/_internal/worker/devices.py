"""Devices and the tf.distribute strategy of one worker: must run before any TensorFlow op."""

from __future__ import annotations

import os

import tensorflow as tf

from raytf._internal.spec import MIRRORED, MULTI_WORKER, TOWERS, StrategySpec
from raytf._internal.tf_config import tf_config_json
from raytf.errors import ConfigError


def configure_devices(spec: StrategySpec) -> tuple[list[str], str]:
    """Make the devices the spec asks for visible to TensorFlow; must run before any op.

    Returns the device names and their kind. Without a GPU that TensorFlow can use (fake GPUs
    declared to Ray, or tensorflow-cpu), logical CPU devices stand in, and the kind says so.
    """
    if spec.use_gpu:
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            for gpu in gpus:  # two actors on one node must not each grab all memory
                tf.config.experimental.set_memory_growth(gpu, True)
            if len(gpus) < spec.devices:
                raise ConfigError(
                    f"The actor was given {spec.devices} GPU(s) but TensorFlow sees "
                    f"{len(gpus)} (CUDA_VISIBLE_DEVICES="
                    f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}). Check that the TensorFlow build "
                    "has CUDA (pip install 'raytf[gpu]') and that `raytf plan` matches the node."
                )
            return [f"/device:GPU:{i}" for i in range(spec.devices)], "GPU"
        kind = "CPU (stand-in: TensorFlow sees no GPU)"
    else:
        kind = "CPU"
    # MultiWorkerMirroredStrategy drives a single CPU device per worker.
    count = 1 if spec.kind == MULTI_WORKER else spec.devices
    if count > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    return [f"/device:CPU:{i}" for i in range(count)], kind


def make_strategy(spec: StrategySpec, devices: list[str]) -> tf.distribute.Strategy | None:
    """The tf.distribute strategy for the spec; None for towers (default strategy)."""
    if spec.kind == TOWERS:
        return None
    if spec.kind == MIRRORED:
        return tf.distribute.MirroredStrategy(devices=devices)
    if spec.kind == MULTI_WORKER:
        if spec.cluster is None:
            raise ConfigError("A multi-worker spec needs the cluster's addresses.")
        os.environ["TF_CONFIG"] = tf_config_json(spec.cluster, "worker", spec.worker_index)
        impl = tf.distribute.experimental.CommunicationImplementation
        chosen = {"ring": impl.RING, "nccl": impl.NCCL, "auto": impl.AUTO}[spec.communication]
        options = tf.distribute.experimental.CommunicationOptions(implementation=chosen)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    raise ConfigError(f"Unknown strategy kind {spec.kind!r}.")

"""Devices and the tf.distribute strategy of one worker: must run before any TensorFlow op."""

from __future__ import annotations

import os

import tensorflow as tf

from raytf._internal.spec import MIRRORED, MULTI_WORKER, TOWERS, StrategySpec
from raytf._internal.tf_config import tf_config_json
from raytf.errors import ConfigError

STANDIN = "CPU (stand-in: TensorFlow sees no GPU)"


def configure_devices(spec: StrategySpec) -> tuple[list[str], str]:
    """Make the devices the spec asks for visible to TensorFlow; must run before any op.

    Returns the device names and their kind. An actor given GPUs must see exactly its own
    (memory growth on, so actors on one node share it); one without GPUs sees none. Where
    Ray declares GPUs TensorFlow cannot use (fake GPUs in tests, tensorflow-cpu), logical CPU
    devices stand in only when ``spec.cpu_standin`` allows it, and the kind says so.
    """
    gpus = tf.config.list_physical_devices("GPU")
    where = f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}"
    if not spec.use_gpu:
        if gpus:  # CPU mode on a GPU node: TensorFlow would take them (and their memory)
            tf.config.set_visible_devices([], "GPU")
        kind = "CPU"
    elif gpus:
        if len(gpus) != spec.devices:
            more = len(gpus) > spec.devices
            raise ConfigError(
                f"The actor was given {spec.devices} GPU(s) but TensorFlow sees {len(gpus)} "
                f"({where}). "
                + (
                    "It would run more replicas than the layout says, on GPUs other actors "
                    "were given: unset RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES so Ray "
                    "gives each actor only its own."
                    if more
                    else "Check that the TensorFlow build has CUDA (pip install 'raytf[gpu]') "
                    "and that `raytf plan` matches the node."
                )
            )
        for gpu in gpus:  # two actors on one node must not each grab all memory
            tf.config.experimental.set_memory_growth(gpu, True)
        return [f"/device:GPU:{i}" for i in range(spec.devices)], "GPU"
    elif not spec.cpu_standin:
        raise ConfigError(
            f"The actor was given {spec.devices} GPU(s) by Ray ({where}) but TensorFlow sees "
            "none, so it would train on CPU while the GPUs sit idle. Usual causes: "
            "tensorflow-cpu instead of the CUDA build (pip install 'raytf[gpu]'), a container "
            "without the NVIDIA runtime, or CUDA libraries TensorFlow cannot load ('Could not "
            "load dynamic library'). `raytf doctor --address auto` checks every node. For "
            "tests and demos with GPUs declared to Ray that do not exist, set "
            "RAYTF_CPU_STANDIN=1 in the driver to train on CPU stand-ins."
        )
    else:
        kind = STANDIN
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

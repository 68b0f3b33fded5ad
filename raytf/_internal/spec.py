"""What one worker actor is told to build: plain, picklable data (no TensorFlow objects)."""

from __future__ import annotations

from dataclasses import dataclass

# How the replicas of one actor are driven.
TOWERS = "towers"  # one tower per device inside one tf.function, gradients averaged by hand
MIRRORED = "mirrored"  # tf.distribute.MirroredStrategy over the actor's devices
MULTI_WORKER = "multi-worker"  # tf.distribute.MultiWorkerMirroredStrategy, TF_CONFIG per actor
PS_TF = "tf-parameter-server"  # a tf.distribute.Server task; the chief runs ParameterServerStrategy


@dataclass(frozen=True)
class StrategySpec:
    kind: str
    devices: int = 1
    use_gpu: bool = False
    worker_index: int = 0
    num_workers: int = 1
    cluster: dict[str, list[str]] | None = None
    communication: str = "auto"  # "ring" | "nccl" | "auto", for multi-worker
    role: str = "worker"  # TensorFlow job name: "worker", "ps" or "chief"
    #: Declared GPUs TensorFlow cannot see may be replaced by logical CPU devices (tests and
    #: demos with fake GPUs: RAYTF_CPU_STANDIN=1 in the driver); otherwise that is an error.
    cpu_standin: bool = False
    #: The user left the in-graph strategy to raytf ("auto"): a model whose own train_step
    #: towers cannot run gets MirroredStrategy instead of a refusal.
    auto: bool = False

    @property
    def is_chief(self) -> bool:
        if self.cluster is not None and "chief" in self.cluster:
            return self.role == "chief"
        return self.role == "worker" and self.worker_index == 0

"""Between-graph all-reduce layout: one actor per worker, MultiWorkerMirroredStrategy."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from raytf._internal.checks import positive_int, positive_number
from raytf._internal.spec import MULTI_WORKER, StrategySpec
from raytf._internal.tf_config import cluster_spec
from raytf.errors import ConfigError
from raytf.layouts._registry import register
from raytf.layouts.base import Layout, check_devices

if TYPE_CHECKING:
    from raytf._internal.runtime.backend import Backend

COMMUNICATIONS = ("auto", "ring", "nccl")


@register("all-reduce")
@dataclass(frozen=True)
class AllReduce(Layout):
    """One actor per worker, each with its own graph, gradients summed by collectives.

    raytf builds TF_CONFIG from the addresses the actors bind themselves; worker 0 is the
    chief and owns checkpoints and the final model. ``communication="auto"`` is NCCL on GPUs
    and RING on CPUs (NCCL has no CPU kernel).
    """

    name = "all-reduce"
    needs_addresses = True

    workers: int = 2
    devices: int = 1
    communication: str = "auto"
    use_gpu: bool = False
    cpus_per_worker: float = 1

    def __post_init__(self) -> None:
        positive_int("workers", self.workers, owner="AllReduce")
        check_devices("AllReduce", "devices", self.devices, self.use_gpu)
        if self.communication not in COMMUNICATIONS:
            raise ConfigError(
                f"AllReduce: unknown communication {self.communication!r}; choose one of "
                f"{list(COMMUNICATIONS)}."
            )
        if self.communication == "nccl" and not self.use_gpu:
            raise ConfigError(
                "AllReduce: communication='nccl' needs GPUs (NCCL has no CPU kernel); "
                "use communication='ring' or 'auto' on CPUs."
            )
        if self.devices > 1 and not self.use_gpu:
            raise ConfigError(
                f"AllReduce: devices={self.devices} per worker needs GPUs; "
                "MultiWorkerMirroredStrategy drives one CPU device per worker. "
                f"Use workers={self.workers * self.devices}, devices=1 instead."
            )
        positive_number("cpus_per_worker", self.cpus_per_worker, owner="AllReduce")

    def backend_cls(self) -> type[Backend]:
        from raytf._internal.backends.collective import CollectiveBackend

        return CollectiveBackend

    @property
    def resolved_communication(self) -> str:
        if self.communication != "auto":
            return self.communication
        return "nccl" if self.use_gpu else "ring"

    @property
    def num_workers(self) -> int:
        return self.workers

    @property
    def devices_per_worker(self) -> int:
        return self.devices

    def bundles(self) -> list[dict[str, float]]:
        bundle = {"CPU": float(self.cpus_per_worker)}
        if self.use_gpu:
            bundle["GPU"] = float(self.devices)
        return [dict(bundle) for _ in range(self.workers)]

    def strategy_specs(self, addresses: list[str] | None) -> list[StrategySpec]:
        if addresses is None or len(addresses) != self.workers:
            raise ConfigError(
                f"AllReduce needs {self.workers} worker addresses, received {addresses!r}."
            )
        cluster = cluster_spec(workers=addresses)
        return [
            StrategySpec(
                kind=MULTI_WORKER,
                devices=self.devices,
                use_gpu=self.use_gpu,
                worker_index=i,
                num_workers=self.workers,
                cluster=cluster,
                communication=self.resolved_communication,
            )
            for i in range(self.workers)
        ]

    @classmethod
    def for_replicas(cls, replicas: int, use_gpu: bool, **options: Any) -> AllReduce:
        devices = options.pop("devices", 1)
        if replicas % devices:
            raise ConfigError(
                f"AllReduce: {replicas} replicas cannot be split into workers of {devices} "
                f"device(s); use a multiple of {devices}."
            )
        return cls(workers=replicas // devices, devices=devices, use_gpu=use_gpu, **options)

    def resized(self, workers: int) -> AllReduce:
        return replace(self, workers=workers)

    def describe(self) -> str:
        kind = "GPU" if self.use_gpu else "CPU"
        return (
            f"all-reduce ({self.resolved_communication.upper()}): {self.workers} actor(s) "
            f"x {self.devices} {kind} device(s)"
        )

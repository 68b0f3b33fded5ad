"""In-graph layout: one actor owns every device of the job on one node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytf._internal.checks import positive_number
from raytf._internal.spec import MIRRORED, TOWERS, StrategySpec
from raytf.errors import ConfigError
from raytf.layouts._registry import register
from raytf.layouts.base import Layout, check_devices, refuse_engine

if TYPE_CHECKING:
    from raytf._internal.runtime.backend import Backend

STRATEGIES = ("auto", TOWERS, MIRRORED)


@register("in-graph")
@register("towers", strategy=TOWERS)
@register("mirrored", strategy=MIRRORED)
@dataclass(frozen=True)
class InGraph(Layout):
    """All replicas in one graph, driven by one actor on one node.

    ``strategy="towers"`` splits each batch over the devices inside one ``tf.function`` and
    averages gradients by hand; on CPU it measured 1.45-1.8x the throughput of
    ``strategy="mirrored"`` (``tf.distribute.MirroredStrategy``) on an MLP and a tie on a CNN
    (docs/benchmarks.md). Mirrored is the choice on GPUs (NCCL all-reduce, variables mirrored
    per device). ``"auto"`` picks by device type.
    """

    name = "in-graph"

    devices: int = 2
    strategy: str = "auto"
    use_gpu: bool = False
    cpus_per_worker: float = 1
    engine: str | None = field(default=None, repr=False, compare=False)  # renamed: strategy

    def __post_init__(self) -> None:
        refuse_engine("InGraph", self.engine, "strategy", "'towers' or 'mirrored'")
        check_devices("InGraph", "devices", self.devices, self.use_gpu)
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"InGraph: unknown strategy {self.strategy!r}; choose one of {list(STRATEGIES)}."
            )
        positive_number("cpus_per_worker", self.cpus_per_worker, owner="InGraph")

    @property
    def resolved_strategy(self) -> str:
        if self.strategy != "auto":
            return self.strategy
        return MIRRORED if self.use_gpu else TOWERS

    def backend_cls(self) -> type[Backend]:
        from raytf._internal.backends.collective import CollectiveBackend

        return CollectiveBackend

    @property
    def num_workers(self) -> int:
        return 1

    @property
    def devices_per_worker(self) -> int:
        return self.devices

    def bundles(self) -> list[dict[str, float]]:
        if self.use_gpu:
            return [{"CPU": float(self.cpus_per_worker), "GPU": float(self.devices)}]
        # A logical CPU device is worth at most one core.
        return [{"CPU": float(max(self.devices, self.cpus_per_worker))}]

    def strategy_specs(self, addresses: list[str] | None) -> list[StrategySpec]:
        return [
            StrategySpec(
                kind=self.resolved_strategy,
                devices=self.devices,
                use_gpu=self.use_gpu,
                auto=self.strategy == "auto",
            )
        ]

    @classmethod
    def for_replicas(cls, replicas: int, use_gpu: bool, **options: Any) -> InGraph:
        return cls(devices=replicas, use_gpu=use_gpu, **options)

    def describe(self) -> str:
        kind = "GPU" if self.use_gpu else "logical CPU"
        return f"in-graph ({self.resolved_strategy}): 1 actor x {self.devices} {kind} device(s)"

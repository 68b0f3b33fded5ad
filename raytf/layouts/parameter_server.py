"""Between-graph parameter-server layout: worker actors plus server actors that own the variables.

Two backends run it. ``"ray"`` (raytf's own): server actors hold the variables' shards and
their optimizer state, workers pull weights, compute gradients with raytf's loop and push them
over direct TCP streams (or Ray's object store); it is synchronous, bounded-stale or
asynchronous, with backup workers. ``"tensorflow"``: ``tf.distribute.Server`` tasks in actors
driven by ``ParameterServerStrategy`` from a chief actor, TensorFlow's own asynchronous mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytf._internal.backends.ray_ps.wire import TCP, TRANSPORTS
from raytf._internal.checks import non_negative_int, positive_int, positive_number
from raytf._internal.spec import PS_TF, TOWERS, StrategySpec
from raytf._internal.tf_config import cluster_spec
from raytf.errors import ConfigError
from raytf.layouts._registry import register
from raytf.layouts.base import Layout, refuse_engine

if TYPE_CHECKING:
    from raytf._internal.runtime.backend import Backend

BACKENDS = ("auto", "ray", "tensorflow")
ASYNC = "async"


@register("parameter-server")
@dataclass(frozen=True)
class ParameterServer(Layout):
    """``workers`` worker actors and ``ps`` server actors; the servers own the variables.

    ``staleness``: ``0`` synchronous (each step averages every worker's gradient, as one big
    batch would); ``k`` lets a worker run at most ``k`` steps ahead of the slowest (stale
    synchronous parallel); ``None`` (or ``"async"``) fully asynchronous. ``backup_workers=b``
    (synchronous only) closes each step on the first ``workers - b`` gradients and drops the
    late ones, so one straggler does not hold everyone up. ``prefetch_weights`` overlaps the
    next pull with the current step's compute when staleness allows (``staleness >= 1``).
    ``transport`` (raytf's backend): ``"tcp"`` sends weights and gradients over direct TCP
    streams between workers and servers (a round trip costs about 0.2 ms on one node, against
    3.6 ms as Ray actor calls); ``"object-store"`` sends them as Ray actor calls, for clusters
    whose nodes reach each other only on Ray's ports.
    """

    name = "parameter-server"
    #: Spread: servers land on other nodes (spare CPU nodes) than the workers when they can.
    placement_strategy = "SPREAD"

    workers: int = 2
    ps: int = 1
    staleness: int | str | None = 0
    backup_workers: int = 0
    backend: str = "auto"
    prefetch_weights: bool = True
    transport: str = "tcp"
    use_gpu: bool = False
    cpus_per_worker: float = 1
    cpus_per_ps: float = 1
    engine: str | None = field(default=None, repr=False, compare=False)  # renamed: backend

    def __post_init__(self) -> None:
        refuse_engine("ParameterServer", self.engine, "backend", "'ray' or 'tensorflow'")
        positive_int("workers", self.workers, owner="ParameterServer")
        if self.ps == 0:
            raise ConfigError(
                "ParameterServer: ps=0 leaves the variables nowhere to live; a parameter-server "
                "layout needs ps=1 or more. For workers without servers use "
                "layout='all-reduce'."
            )
        positive_int("ps", self.ps, owner="ParameterServer")
        staleness = None if self.staleness == ASYNC else self.staleness
        if staleness is not None and (
            isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0
        ):
            raise ConfigError(
                f"ParameterServer: staleness must be 0 (synchronous), a positive number of "
                f"steps k (a worker runs at most k steps ahead of the slowest) or None / "
                f"'async' (unbounded), received {self.staleness!r}."
            )
        object.__setattr__(self, "staleness", staleness)
        b = self.backup_workers
        non_negative_int("backup_workers", b, owner="ParameterServer")
        if b >= self.workers:
            raise ConfigError(
                f"ParameterServer: backup_workers={b} with workers={self.workers} would close a "
                f"step on no gradient at all; use at most {self.workers - 1} backup worker(s)."
            )
        if b and staleness != 0:
            raise ConfigError(
                f"ParameterServer: backup_workers={b} needs staleness=0 (synchronous): only a "
                f"synchronous step waits for stragglers; with staleness={self.staleness!r} "
                "nobody waits, so there is nothing to drop."
            )
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"ParameterServer: unknown backend {self.backend!r}; choose one of "
                f"{list(BACKENDS)}."
            )
        if self.backend == "tensorflow" and (staleness is not None or b):
            raise ConfigError(
                f"ParameterServer: backend='tensorflow' (ParameterServerStrategy) is "
                f"asynchronous only, received staleness={self.staleness!r}, backup_workers={b}. "
                "Pass staleness=None for TensorFlow's backend, or backend='ray' for "
                "synchronous, bounded-staleness and backup-worker training."
            )
        if self.transport not in TRANSPORTS:
            raise ConfigError(
                f"ParameterServer: unknown transport {self.transport!r}; choose 'tcp' (direct "
                "streams between workers and servers) or 'object-store' (Ray actor calls, for "
                "nodes that reach each other only on Ray's ports)."
            )
        if self.backend == "tensorflow" and self.transport != TCP:
            raise ConfigError(
                f"ParameterServer: transport={self.transport!r} is raytf's backend's; "
                "backend='tensorflow' always uses TensorFlow's gRPC. Drop transport= or use "
                "backend='ray'."
            )
        for name in ("cpus_per_worker", "cpus_per_ps"):
            positive_number(name, getattr(self, name), owner="ParameterServer")

    # ------------------------------------------------------------------ shape
    @property
    def resolved_backend(self) -> str:
        """``auto`` is raytf's own backend: the one with every mode, server checkpoints and
        staleness metrics; TensorFlow's is there to be asked for by name."""
        return "ray" if self.backend == "auto" else self.backend

    @property
    def mode(self) -> str:
        if self.staleness is None:
            return "async"
        return "sync" if self.staleness == 0 else f"bounded staleness {self.staleness}"

    @property
    def num_workers(self) -> int:
        return self.workers

    @property
    def devices_per_worker(self) -> int:
        return 1

    def worker_bundle(self) -> dict[str, float]:
        bundle = {"CPU": float(self.cpus_per_worker)}
        if self.use_gpu:
            bundle["GPU"] = 1.0
        return bundle

    def bundles(self) -> list[dict[str, float]]:
        """Workers first, then servers; TensorFlow's backend adds its chief (the coordinator)."""
        out = [self.worker_bundle() for _ in range(self.workers)]
        out += [{"CPU": float(self.cpus_per_ps)} for _ in range(self.ps)]
        if self.resolved_backend == "tensorflow":
            out.append({"CPU": float(self.cpus_per_ps)})
        return out

    def roles(self) -> list[tuple[str, int]]:
        """(TensorFlow job name, task index) of each bundle, in bundle order."""
        out = [("worker", i) for i in range(self.workers)] + [("ps", i) for i in range(self.ps)]
        if self.resolved_backend == "tensorflow":
            out.append(("chief", 0))
        return out

    def strategy_specs(self, addresses: list[str] | None) -> list[StrategySpec]:
        """One spec per bundle. raytf's backend: plain one-device workers (servers take no
        spec from here); TensorFlow's: every task with the whole cluster spec."""
        if self.resolved_backend == "ray":
            return [
                StrategySpec(
                    kind=TOWERS,
                    use_gpu=self.use_gpu,
                    worker_index=i,
                    num_workers=self.workers,
                    role="worker",
                )
                for i in range(self.workers)
            ]
        roles = self.roles()
        if addresses is None or len(addresses) != len(roles):
            raise ConfigError(
                f"ParameterServer needs {len(roles)} task addresses, received {addresses!r}."
            )
        cluster = cluster_spec(
            workers=addresses[: self.workers],
            ps=addresses[self.workers : self.workers + self.ps],
            chief=addresses[-1],
        )
        return [
            StrategySpec(
                kind=PS_TF,
                use_gpu=self.use_gpu and role == "worker",
                worker_index=index,
                num_workers=self.workers,
                cluster=cluster,
                role=role,
            )
            for role, index in roles
        ]

    @classmethod
    def for_replicas(cls, replicas: int, use_gpu: bool, **options: Any) -> ParameterServer:
        if options.pop("devices", 1) != 1:
            raise ConfigError("ParameterServer drives one device per worker; drop devices=.")
        return cls(workers=replicas, use_gpu=use_gpu, **options)

    def backend_cls(self) -> type[Backend]:
        if self.resolved_backend == "tensorflow":
            from raytf._internal.backends.tf_ps.backend import TFParameterServerBackend

            return TFParameterServerBackend
        from raytf._internal.backends.ray_ps.backend import RayParameterServerBackend

        return RayParameterServerBackend

    def describe(self) -> str:
        kind = "GPU" if self.use_gpu else "CPU"
        extra = f", {self.backup_workers} backup" if self.backup_workers else ""
        return (
            f"parameter-server ({self.mode}{extra}, backend {self.resolved_backend}): "
            f"{self.workers} {kind} worker(s) + {self.ps} server(s)"
        )

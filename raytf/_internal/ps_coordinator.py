"""Driver side of raytf's parameter-server engine: servers beside the workers, sharded by size.

The run is the core coordinator's (placement, fail-fast waits, epochs, teardown) with hooks:
after the workers build the model, worker 0's variables are sharded over the servers by size
and the servers take them with the model's optimizer; each epoch opens on the servers first;
checkpoints are the servers' state; the result gains server load and staleness figures.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from raytf._internal.coordinator import Coordinator, WorkerGroup
from raytf._internal.ps_server import ParameterShard
from raytf._internal.ps_worker import PSWorker
from raytf._internal.sharding import shard_by_size
from raytf.errors import ConfigError


class PSGroup(WorkerGroup):
    """Worker actors (``actors``) and parameter-server actors (``servers``)."""

    worker_cls = PSWorker

    def __init__(self, layout: Any, placement: Any) -> None:
        super().__init__(layout, placement)
        self.servers: list[Any] = []
        self.server_names: list[str] = []

    def spawn(self) -> None:
        # Servers first: their TensorFlow import overlaps the workers' start.
        bundles = self.layout.bundles()
        first = self.layout.num_workers
        for j in range(self.layout.ps):
            name = f"ps-{j}"
            self.servers.append(self._spawn(ParameterShard, first + j, bundles[first + j], name, j))
            self.server_names.append(name)
        super().spawn()

    def call_servers(
        self, method: str, args: list[tuple] | None, timeout_s: float, phase: str
    ) -> list[Any]:
        return self.call_on(self.servers, self.server_names, method, args, timeout_s, phase)

    def shutdown(self) -> None:
        self.actors += self.servers
        self.servers = []
        super().shutdown()


class ParameterServerCoordinator(Coordinator):
    group_class = PSGroup
    mid_epoch_checkpoints = False  # the servers hold the state and end the epochs

    def _start_strategies(self, group: PSGroup, specs: list[Any]) -> list[Any]:  # type: ignore[override]
        # Inside the start-up's try: a server that fails to come up stops every actor.
        devices = super()._start_strategies(group, specs)
        self.server_rows = group.call_servers("ready", None, self.timeouts.start_s, "start")
        return devices

    def _prepare(self, group: PSGroup, infos: list[dict[str, Any]]) -> int:  # type: ignore[override]
        layout, t = self.layout, self.timeouts
        variables = group.call_on(
            group.actors[:1], group.names[:1], "variables", None, t.start_s, "start"
        )[0]
        if not any(v["trainable"] for v in variables):
            raise ConfigError("The model has no trainable variables: nothing for servers to train.")
        owner = shard_by_size([v["value"].nbytes for v in variables], layout.ps)
        config = {
            "workers": layout.workers,
            "servers": layout.ps,
            "staleness": layout.staleness,
            "backup_workers": layout.backup_workers,
            "prefetch_weights": layout.prefetch_weights,
            "checkpoint_dir": self._job.checkpoint_dir,
            "resume": self._job.resume,
        }
        shards = [[v for v, o in zip(variables, owner) if o == s] for s in range(layout.ps)]
        built = group.call_servers(
            "build", [(self._job, shard, config) for shard in shards], t.start_s, "start"
        )
        self.placement_of = {v["name"]: group.server_names[o] for v, o in zip(variables, owner)}
        for row, b in zip(self.server_rows, built):
            row.update(variables=b["variables"], bytes=b["bytes"])
        group.call(
            "connect",
            [(group.servers, group.server_names, owner, config)] * len(group.actors),
            t.start_s,
            "start",
        )
        # Servers hold the state: their checkpoints decide where training resumes.
        return super()._prepare(group, built)

    def _before_epoch(self, group: PSGroup, epoch: int, steps: int) -> None:  # type: ignore[override]
        group.call_servers(
            "start_epoch", [(steps,)] * len(group.servers), self.timeouts.start_s, "start"
        )

    def _after_epoch(  # type: ignore[override]
        self, group: PSGroup, epoch: int, results: list[dict[str, Any]]
    ) -> str | None:
        job = self._job
        if not job.checkpoint_dir:
            return None
        if (epoch + 1) % job.checkpoint_every and epoch + 1 != job.epochs:
            return None
        paths = group.call_servers(
            "save", [(epoch,)] * len(group.servers), self.timeouts.start_s, "checkpoint"
        )
        return paths[0]

    def _report(self, group: PSGroup) -> dict[str, Any]:  # type: ignore[override]
        reports = group.call_servers("report", None, self.timeouts.start_s, "final")
        servers = [{**row, **rep} for row, rep in zip(self.server_rows, reports)]
        for row in servers:
            row["holds"] = sorted(n for n, s in self.placement_of.items() if s == row["name"])
        staleness: Counter[int] = Counter()
        ahead: Counter[int] = Counter()
        for rep in reports:
            staleness.update(rep["staleness"])
            ahead.update(rep["steps_ahead"])
        return {
            "servers": servers,
            "staleness": summarize(staleness),
            "steps_ahead": summarize(ahead) if ahead else None,
            "global_step": reports[0]["version"],
        }


def summarize(histogram: Counter[int]) -> dict[str, Any] | None:
    """Percentiles of an integer histogram, with the histogram itself."""
    total = sum(histogram.values())
    if not total:
        return None
    values = sorted(histogram)

    def pct(q: float) -> int:
        rank = q * (total - 1)
        seen = 0
        for v in values:
            seen += histogram[v]
            if seen > rank:
                return v
        return values[-1]

    return {
        "histogram": {int(v): int(histogram[v]) for v in values},
        "count": total,
        "mean": sum(v * c for v, c in histogram.items()) / total,
        "p50": pct(0.5),
        "p90": pct(0.9),
        "p99": pct(0.99),
        "max": values[-1],
    }

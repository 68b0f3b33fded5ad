"""Driver side of raytf's parameter-server engine: servers beside the workers, sharded by size.

The run is the core coordinator's (placement, fail-fast waits, epochs, teardown) with hooks:
after the workers build the model, worker 0's variables are sharded over the servers by size
and the servers take them with the model's optimizer; each epoch opens on the servers first;
checkpoints are the servers' state; the result gains server load and staleness figures.

A worker that dies mid-epoch is replaced in place: the servers keep their state, the other
workers keep training (or wait at the synchronous barrier or the staleness bound), and the
replacement goes on from the dead worker's last batch the servers counted. Nothing is redone.
A server that dies takes the group down and the run restarts from the servers' checkpoint.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import ray

from raytf._internal.coordinator import Coordinator, WorkerGroup, _unwrap
from raytf._internal.ps_server import ParameterShard
from raytf._internal.ps_worker import PSWorker
from raytf._internal.sharding import shard_by_size
from raytf.errors import ConfigError, RaytfError, StartupTimeoutError


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
    """Epochs (and the segments of FailurePolicy's intervals) open and end on the servers,
    and the servers write the checkpoints."""

    group_class = PSGroup

    def _start_strategies(self, group: PSGroup, specs: list[Any]) -> list[Any]:  # type: ignore[override]
        # Inside the start-up's try: a server that fails to come up stops every actor.
        self._specs = specs  # a replacement worker gets the same spec
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
        self._connect = (group.servers, group.server_names, owner, config)
        group.call("connect", [self._connect] * len(group.actors), t.start_s, "start")
        # Servers hold the state: their checkpoints decide where training resumes.
        steps_at = {b["start_step"] for b in built}
        if len(steps_at) > 1:
            raise ConfigError(
                f"Parameter servers restored different steps {sorted(steps_at)} from "
                f"{self._job.checkpoint_dir!r}: checkpoint_dir must be storage every node can "
                "read, written by one run."
            )
        for info in infos:  # workers keep no state: where the servers are is where all are
            info.update(start_step=built[0]["start_step"], restored=built[0]["restored"])
        return super()._prepare(group, built)

    def _save_segment(self, group: PSGroup, epoch: int, step: int) -> str | None:  # type: ignore[override]
        args = [(epoch, step)] * len(group.servers)
        return group.call_servers("save", args, self.timeouts.start_s, "checkpoint")[0]

    def _train(self, group: PSGroup, args: tuple, timeout_s: float) -> list[dict[str, Any]]:  # type: ignore[override]
        """Run the segment on every worker; replace a worker that dies, in place, while the
        policy allows. Any other error (a server's death, a bug) ends the attempt."""
        _, _, _, start, stop = args
        # The servers end the segment: its steps (x workers when applied one by one).
        opened = [(stop - start,)] * len(group.servers)
        group.call_servers("start_epoch", opened, self.timeouts.start_s, "start")
        refs = {a.run_epoch.remote(*args): i for i, a in enumerate(group.actors)}
        results: list[Any] = [None] * len(refs)
        deadline = time.monotonic() + timeout_s
        while refs:
            ready, _ = ray.wait(
                list(refs), num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            if not ready:
                missing = sorted(group.names[i] for i in refs.values())
                raise StartupTimeoutError(group._timeout_message("epoch", timeout_s, missing))
            i = refs.pop(ready[0])
            try:
                results[i] = ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:  # this worker's own process is gone
                error = _unwrap(exc, group.names[i])
                if len(self._run.failures) >= self.failure_policy.max_failures:
                    raise error from None
                refs[self._replace_worker(group, i, error, args)] = i
            except Exception as exc:
                raise _unwrap(exc, group.names[i]) from None
        return results

    def _replace_worker(self, group: PSGroup, i: int, error: RaytfError, args: tuple) -> Any:
        """Start a new worker ``i`` against the running servers; returns its segment's ref."""
        t = self.timeouts
        with self._replacing(error) as record:
            # Refuse the dead process's pushes still in flight and drop its gradient from an
            # open synchronous step first: from here nothing it sent can be applied.
            consumed = group.call_servers("forget", [(i,)] * len(group.servers), t.start_s, "start")
            actor = group.replace(i)

            def call(method: str, *a: Any) -> Any:
                names = [group.names[i]]
                return group.call_on([actor], names, method, [a], t.start_s, "start")[0]

            row = call("ready")
            call("start_strategy", self._specs[i])
            call("build", self._job)
            call("connect", *self._connect)
            clock = max(consumed)  # a batch any server counted is not computed again
            generation = group.call_servers(
                "rejoin", [(i, clock)] * len(group.servers), t.start_s, "start"
            )[0]
            call("rejoin", clock, generation, self._start_position)
        self._replaced(record, row, 0, clock)
        return actor.run_epoch.remote(*args)

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

"""Driver side of raytf's parameter-server backend: servers beside the workers, sharded by size.

After the workers build the model, worker 0's variables are sharded over the servers by size
and the servers take them with the model's optimizer; each segment opens on the servers
first; checkpoints are the servers' state; the report adds server load and staleness.

A worker that dies mid-segment is replaced in place: the servers keep their state, the other
workers keep training (or wait at the synchronous barrier or the staleness bound), and the
replacement goes on from the dead worker's last batch the servers counted. Nothing is redone.
A server that dies ends the attempt; the controller restarts from the servers' checkpoint.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from raytf._internal.backends.collective import agree, worker_names
from raytf._internal.backends.ray_ps.server import ParameterShard
from raytf._internal.backends.ray_ps.worker import PSWorker
from raytf._internal.job import Job
from raytf._internal.runtime.backend import Backend, Built, EpochEnd, Report
from raytf._internal.runtime.group import ActorGroup, Member
from raytf._internal.runtime.schedule import Segment
from raytf._internal.sharding import shard_by_size
from raytf.errors import ConfigError


class RayParameterServerBackend(Backend):
    """Epochs (and the segments of FailurePolicy's intervals) open and end on the servers,
    and the servers write the checkpoints."""

    def spawn(self, group: ActorGroup) -> None:
        layout = self.layout
        # Servers first: their TensorFlow import overlaps the workers' start.
        for j in range(layout.ps):
            group.spawn(f"ps-{j}", "ps", layout.workers + j, ParameterShard, j)
        for i, name in enumerate(worker_names(layout.workers)):
            group.spawn(name, "worker", i, PSWorker)

    def _on(self, group: ActorGroup, role: str, method: str, *args: Any, phase: str = "start"):
        members = group.of(role)
        timeout = self.timeouts.start_s
        return group.call(members, method, [args] * len(members), timeout_s=timeout, phase=phase)

    def start(self, group: ActorGroup) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        ready = self._on(group, "worker", "ready")
        # Inside the start-up: a server that fails to come up stops every actor.
        self.specs = self.strategy_specs(None)
        started = group.call(
            group.of("worker"),
            "start",
            [(s,) for s in self.specs],
            timeout_s=self.timeouts.peers_s,
            phase="peers",
        )
        self.server_rows = self._on(group, "ps", "ready")
        return [{**r, **s} for r, s in zip(ready, started)], self.server_rows

    def build(self, group: ActorGroup, job: Job, recovering: bool) -> Built:
        layout, t = self.layout, self.timeouts
        self.job, self.start_position = job, 0
        workers, servers = group.of("worker"), group.of("ps")
        infos = self._on(group, "worker", "build", job)
        variables = group.call(workers[:1], "variables", timeout_s=t.start_s, phase="start")[0]
        if not any(v["trainable"] for v in variables):
            raise ConfigError("The model has no trainable variables: nothing for servers to train.")
        owner = shard_by_size([v["value"].nbytes for v in variables], layout.ps)
        config = {
            "workers": layout.workers,
            "servers": layout.ps,
            "staleness": layout.staleness,
            "backup_workers": layout.backup_workers,
            "prefetch_weights": layout.prefetch_weights,
            "transport": layout.transport,
            "checkpoint_dir": job.checkpoint_dir,
            "resume": job.resume,
            "keep": job.keep_checkpoints,
            "learning_rate": None,  # the servers' (after a restore), set below
        }
        shards = [[v for v, o in zip(variables, owner) if o == s] for s in range(layout.ps)]
        built = group.call(
            servers,
            "build",
            [(job, shard, config) for shard in shards],
            timeout_s=t.start_s,
            phase="start",
        )
        config["learning_rate"] = self.learning_rate = built[0].get("learning_rate")
        names = [m.name for m in servers]
        self.placement_of = {v["name"]: names[o] for v, o in zip(variables, owner)}
        for row, b in zip(self.server_rows, built):
            row.update(variables=b["variables"], bytes=b["bytes"], address=b["address"])
        config["addresses"] = [b["address"] for b in built]  # transport="tcp": host:port
        self.connect = ([m.actor for m in servers], names, owner, config)
        self._on(group, "worker", "connect", *self.connect)
        # Servers hold the state: their checkpoints decide where training resumes; workers
        # keep none, so where the servers are is where all are.
        return agree(infos, job, recovering, state=built)

    def seek(self, group: ActorGroup, position: int) -> None:
        self.start_position = position  # where every worker's data started
        self._on(group, "worker", "seek", position)

    def train(self, group: ActorGroup, segment: Segment, timeout_s: float) -> list[dict]:
        """Run the segment on every worker; replace a worker that dies, in place, while the
        policy allows. Any other error (a server's death, a bug) ends the attempt."""
        # The servers end the segment: its steps (x workers when applied one by one).
        self._on(group, "ps", "start_epoch", segment.stop - segment.start)
        workers = group.of("worker")
        refs = {m.actor.run_epoch.remote(*segment.args()): m for m in workers}

        def replace(member: Member, error: BaseException) -> Any:
            return self._replace_worker(group, member, error, segment)

        done = group.wait(
            refs, timeout_s=timeout_s, phase="epoch", on_lost=replace, look_for_peers=False
        )
        return [done[m] for m in workers]

    def _replace_worker(
        self, group: ActorGroup, member: Member, error: Any, segment: Segment
    ) -> Any:
        """Start a new worker against the running servers; returns its segment's ref."""
        t = self.timeouts
        i = group.of("worker").index(member)
        servers = group.of("ps")
        inputs = (self.job.data_fn, self.job.validation_fn)
        if not all(getattr(fn, "restartable_in_place", True) for fn in inputs):
            raise error  # its input cannot be rejoined alone: the group restarts instead
        with self.hooks.replacing(error):
            # Refuse the dead process's pushes still in flight and drop its gradient from an
            # open synchronous step first: from here nothing it sent can be applied.
            consumed = group.call(
                servers, "forget", [(i,)] * len(servers), timeout_s=t.start_s, phase="start"
            )
            group.replace(member)

            def call(method: str, *args: Any) -> Any:
                return group.call([member], method, [args], timeout_s=t.start_s, phase="start")[0]

            row = call("ready")
            call("start", self.specs[i])
            call("build", self.job)
            call("connect", *self.connect)
            clock = max(consumed)  # a batch any server counted is not computed again
            generation = group.call(
                servers, "rejoin", [(i, clock)] * len(servers), timeout_s=t.start_s, phase="start"
            )[0]
            call("rejoin", clock, generation, self.start_position)
        self.hooks.replaced(row, 0, clock)
        return member.actor.run_epoch.remote(*segment.args())

    def save(self, group: ActorGroup, epoch: int, step: int) -> str | None:
        return self._on(group, "ps", "save", epoch, step, phase="checkpoint")[0]

    def begin_epoch(self, group: ActorGroup, epoch: int) -> None:
        """Workers call ``on_epoch_begin``; a learning rate it set reaches every server
        before any worker's first push of the epoch."""
        rates = self._on(group, "worker", "begin_epoch", epoch, phase="epoch")
        self._set_learning_rate(group, rates[0])

    def _set_learning_rate(self, group: ActorGroup, value: float | None) -> None:
        """The chief's learning rate is every server's (each has the optimizer's copy)."""
        if value is not None and value != self.learning_rate:
            self._on(group, "ps", "set_learning_rate", value, phase="epoch")
            self.learning_rate = self.connect[3]["learning_rate"] = value  # for replacements

    def end_epoch(
        self, group: ActorGroup, epoch: int, results: list[dict], logs: dict[str, float]
    ) -> EpochEnd:
        """Callbacks on the merged logs, on every worker (the chief's writers too), their
        learning rate to the servers; then the servers' checkpoint, which holds it."""
        ends = self._on(group, "worker", "end_epoch", epoch, logs, phase="epoch")
        self._set_learning_rate(group, ends[0]["learning_rate"])
        stop = any(e["stop_training"] for e in ends)
        job, path = self.job, None
        due = (epoch + 1) % job.checkpoint_every == 0 or epoch + 1 == job.epochs
        if job.checkpoint_dir and due:
            path = self._on(group, "ps", "save", epoch, phase="checkpoint")[0]
        return EpochEnd(path, ends[0]["logs"], stop)

    def report(self, group: ActorGroup) -> Report:
        workers = group.of("worker")
        finals = group.call(
            workers,
            "final",
            [(i == 0,) for i in range(len(workers))],
            timeout_s=self.timeouts.start_s,
            phase="final",
        )
        reports = self._on(group, "ps", "report", phase="final")
        servers = [{**row, **rep} for row, rep in zip(self.server_rows, reports)]
        for row in servers:
            row["holds"] = sorted(n for n, s in self.placement_of.items() if s == row["name"])
        staleness: Counter[int] = Counter()
        ahead: Counter[int] = Counter()
        for rep in reports:
            staleness.update(rep["staleness"])
            ahead.update(rep["steps_ahead"])
        return Report(
            finals=finals,
            servers=servers,
            staleness=summarize(staleness),
            steps_ahead=summarize(ahead) if ahead else None,
            global_step=reports[0]["version"],
        )


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

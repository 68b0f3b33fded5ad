"""In-graph and all-reduce layouts: every actor is a worker, kept in sync by its strategy.

In-graph: one actor drives every replica (towers or MirroredStrategy). All-reduce: one actor
per worker, MultiWorkerMirroredStrategy over TF_CONFIG built from the ports the actors bound
themselves. The worker that dies takes the group down; the controller restarts it from the
newest checkpoint.
"""

from __future__ import annotations

from typing import Any

from raytf._internal.job import Job
from raytf._internal.runtime.backend import Backend, Built, EpochEnd, Report
from raytf._internal.runtime.group import ActorGroup, Member
from raytf._internal.runtime.schedule import Segment, agreed_start, agreed_step
from raytf._internal.spec import StrategySpec
from raytf._internal.worker.process import Process, surface_errors


class CollectiveWorker:
    """One worker: its devices, its strategy and raytf's loop. Made an actor at spawn."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc = Process(name)

    def ready(self) -> dict[str, Any]:
        return self.proc.info()

    def reserve_address(self) -> str:
        return self.proc.reserve_address()

    @surface_errors
    def start(self, spec: StrategySpec) -> dict[str, Any]:
        """Set devices and build the strategy; for multi-worker this waits for every peer."""
        from raytf._internal.worker.devices import configure_devices, make_strategy

        self.spec = spec
        self.devices, kind = configure_devices(spec)
        self.proc.release_address()
        self.strategy = make_strategy(spec, self.devices)
        # MultiWorkerMirroredStrategy's coordination service installs its own SIGTERM
        # notifier, which would swallow the signal: raytf's handler goes back on top.
        self.proc.handle_sigterm()
        address = spec.cluster["worker"][spec.worker_index] if spec.cluster else None
        return {"devices": self.devices, "device_kind": kind, "address": address}

    @surface_errors
    def build(self, job: Job) -> dict[str, Any]:
        from raytf._internal.worker.loop import strategy_loop

        self.loop, info = strategy_loop(
            self.spec, job, self.devices, self.strategy, lambda: self.proc.preempted
        )
        return info

    @surface_errors
    def run_epoch(self, *segment: Any) -> dict[str, Any]:
        return self.proc.guarded(lambda: self.loop.run_epoch(*segment))

    @surface_errors
    def save(self, epoch: int, step: int) -> str | None:
        # A SIGTERM now waits for the write instead of cutting it short.
        return self.proc.guarded(lambda: self.loop.save(epoch, step))

    @surface_errors
    def seek(self, batches: int) -> None:
        self.loop.runner.seek(batches)

    @surface_errors
    def set_learning_rate(self, value: float) -> None:
        self.loop.set_learning_rate(value)

    @surface_errors
    def final(self, with_model: bool) -> dict[str, Any]:
        return self.loop.final(with_model)


def worker_names(count: int) -> list[str]:
    return [f"worker-{i}" for i in range(count)] if count > 1 else ["worker"]


def agree(
    infos: list[dict[str, Any]], job: Job, recovering: bool, state: list[dict] | None = None
) -> Built:
    """What every worker's build reported, agreed: steps per epoch, and where to start,
    from the actors that hold the state (``state``: the parameter servers; by default the
    workers themselves)."""
    who = "Workers" if state is None else "Parameter servers"
    state = infos if state is None else state
    steps = job.steps_per_epoch or min(i["train_steps"] for i in infos)
    val_steps = None
    if job.validation_fn is not None:
        val_steps = job.validation_steps or min(i["validation_steps"] for i in infos)
    where = job.checkpoint_dir
    start_epoch = agreed_start([i["start_epoch"] for i in state], job.epochs, where, recovering)
    start_step = 0
    if start_epoch < job.epochs:
        start_step = agreed_step([i["start_step"] for i in state], where, who)
    if job.initial_epoch > start_epoch:  # Keras' initial_epoch: count from there
        start_epoch, start_step = job.initial_epoch, 0
    return Built(
        steps=steps,
        validation_steps=val_steps,
        start_epoch=start_epoch,
        start_step=start_step,
        restored=state[0]["restored"],
        skipped=tuple(state[0].get("skipped_checkpoints", ())),
        note=infos[0].get("note"),
    )


class CollectiveBackend(Backend):
    """Every call goes to every worker; worker 0 is the chief (checkpoints, final model)."""

    def spawn(self, group: ActorGroup) -> None:
        for i, name in enumerate(worker_names(self.layout.num_workers)):
            group.spawn(name, "worker", i, CollectiveWorker)

    def _all(self, group: ActorGroup, method: str, *args: Any, phase: str = "start") -> list:
        workers = group.of("worker")
        timeout = self.timeouts.start_s
        return group.call(workers, method, [args] * len(workers), timeout_s=timeout, phase=phase)

    def start(self, group: ActorGroup) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        workers: list[Member] = group.of("worker")
        ready = self._all(group, "ready")
        addresses = self._all(group, "reserve_address") if self.layout.needs_addresses else None
        specs = self.strategy_specs(addresses)
        started = group.call(
            workers, "start", [(s,) for s in specs], timeout_s=self.timeouts.peers_s, phase="peers"
        )
        return [{**r, **s} for r, s in zip(ready, started)], []

    def build(self, group: ActorGroup, job: Job, recovering: bool) -> Built:
        return agree(self._all(group, "build", job), job, recovering)

    def seek(self, group: ActorGroup, position: int) -> None:
        self._all(group, "seek", position)

    def train(self, group: ActorGroup, segment: Segment, timeout_s: float) -> list[dict]:
        workers = group.of("worker")
        args = [segment.args()] * len(workers)
        return group.call(workers, "run_epoch", args, timeout_s=timeout_s, phase="epoch")

    def save(self, group: ActorGroup, epoch: int, step: int) -> str | None:
        return self._all(group, "save", epoch, step, phase="checkpoint")[0]

    def end_epoch(
        self, group: ActorGroup, epoch: int, results: list[dict], logs: dict[str, float]
    ) -> EpochEnd:
        # Every worker ran the same callbacks on the same global logs; should a callback of
        # the user's have decided otherwise on one, the chief's learning rate is everyone's.
        rates = [r.get("learning_rate") for r in results]
        if rates[0] is not None and len(set(rates)) > 1:
            self._all(group, "set_learning_rate", rates[0], phase="epoch")
        stop = any(r.get("stop_training") for r in results)
        return EpochEnd(results[0]["checkpoint"], logs, stop)

    def report(self, group: ActorGroup) -> Report:
        workers = group.of("worker")
        args = [(i == 0,) for i in range(len(workers))]
        finals = group.call(workers, "final", args, timeout_s=self.timeouts.start_s, phase="final")
        return Report(finals=finals)

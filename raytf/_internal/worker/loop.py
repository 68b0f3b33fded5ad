"""raytf's training loop for one worker: epochs and segments over a runner of steps.

The loop owns what every layout's epochs share (metrics, validation, checkpoints, TensorBoard,
preemption, the final model); a runner owns how steps run: :class:`StrategyRunner` inside
this process's strategy or towers (in-graph, all-reduce), TensorFlow's PS chief schedules
closures on remote workers instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import tensorflow as tf

from raytf._internal.job import Job
from raytf._internal.spec import StrategySpec
from raytf._internal.worker import steps as S
from raytf._internal.worker.checkpoints import Checkpoints
from raytf._internal.worker.devices import configure_devices, make_strategy
from raytf._internal.worker.model import ModelData
from raytf._internal.worker.preemption import Agreement
from raytf.config import AUTO_STEPS_PER_EXECUTION
from raytf.data import InputContext


def steps_per_call(job: Job, steps: int) -> int:
    """Steps per tf.function call: the job's ``steps_per_execution``, at most ``steps``."""
    spe = job.steps_per_execution
    return min(steps, AUTO_STEPS_PER_EXECUTION if spe == "auto" else int(spe))


class Runner(Protocol):
    clock: S.StepClock
    batch: int  # examples this worker trains per step

    def train(self, steps: int, before_call: Callable[[int], None]) -> None: ...
    def evaluate(self, validation_steps: int) -> None: ...
    def seek(self, batches: int) -> None: ...


class StrategyRunner:
    """Steps inside ``strategy`` (per-replica batches), or towers over ``devices`` when there
    is no strategy and several devices."""

    def __init__(
        self, md: ModelData, devices: list[str], towers: bool, distribute: bool, job: Job
    ) -> None:
        self.md, self.job, self.towers, self.distribute = md, job, towers, distribute
        self.clock = S.StepClock()
        self.batch = md.ctx.worker_batch_size
        step = S.towers_step(md, devices) if towers else S.replica_step(md)
        self._train_n = S.loop_of(step)
        self._eval_n = S.loop_of(S.eval_step(md, replicated=not towers))
        self._val = None
        if md.validation is not None:
            self._val = self._distribute(md.validation.repeat().prefetch(tf.data.AUTOTUNE))
        self.seek(0)

    def _distribute(self, dataset: tf.data.Dataset) -> Any:
        if not self.distribute:
            return dataset
        # Each worker already holds its own shard: no auto-sharding, no rebatching.
        return self.md.strategy.distribute_datasets_from_function(lambda _ctx: dataset)

    def seek(self, batches: int) -> None:
        """Continue the data where a restored checkpoint left it: skip ``batches`` steps."""
        data = self.md.skipped(batches).prefetch(tf.data.AUTOTUNE)
        self._iterator = iter(self._distribute(data))

    def train(self, steps: int, before_call: Callable[[int], None]) -> None:
        k = steps_per_call(self.job, steps)
        done = 0
        while done < steps:
            before_call(done)
            n = min(k, steps - done) if self.clock.warm else 1  # trace on one step
            t0 = time.perf_counter()
            self._train_n(self._iterator, tf.constant(n)).numpy()
            self.clock.record(n, t0)
            done += n

    def evaluate(self, validation_steps: int) -> None:
        self._eval_n(iter(self._val), tf.constant(validation_steps)).numpy()


class TrainLoop:
    """One worker's epochs: ``runner`` steps, ``checkpoints`` saves, ``agreement`` stops
    every worker at the same step on SIGTERM (``preempted`` reads this process's flag)."""

    def __init__(
        self,
        md: ModelData,
        runner: Runner,
        checkpoints: Checkpoints,
        agreement: Agreement | None = None,
        preempted: Callable[[], bool] = lambda: False,
    ) -> None:
        self.md, self.runner, self.checkpoints = md, runner, checkpoints
        self.agreement = agreement
        self.preempted = preempted

    @property
    def global_step(self) -> int:
        return int(self.md.optimizer.iterations.numpy())

    @property
    def throughput(self) -> float | None:
        return self.runner.clock.throughput(self.runner.batch)

    def run_epoch(
        self,
        epoch: int,
        steps: int,
        validation_steps: int | None,
        start: int = 0,
        stop: int | None = None,
    ) -> dict[str, Any]:
        """Train steps ``start..stop`` of the epoch (default: all ``steps``); at the epoch's
        end validate and checkpoint. Returns logs (None mid-epoch) and this worker's rate."""
        stop = steps if stop is None else stop
        if start == 0:
            self.md.reset_metrics()
        self.runner.train(
            stop - start, lambda done: self._check_preempted(epoch, start + done, steps)
        )
        out: dict[str, Any] = {"logs": None, "checkpoint": None}
        if stop >= steps:
            out["logs"], out["checkpoint"] = self._end_epoch(epoch, validation_steps)
        return {**out, "throughput": self.throughput, "global_step": self.global_step}

    def _check_preempted(self, epoch: int, step: int, epoch_steps: int) -> None:
        if self.agreement is None:
            return
        collective = self.checkpoints.manager is not None
        stopping = self.agreement.stopping(self.preempted(), collective)
        if stopping:  # SIGTERM: every worker saves at this same step, then they leave
            save = self.save if self.checkpoints.manager is not None else None
            self.agreement.stop(stopping, epoch, step, epoch_steps, save)

    def _end_epoch(self, epoch: int, validation_steps: int | None) -> tuple[dict, str | None]:
        """Metrics, validation, TensorBoard and the checkpoint of a finished epoch."""
        logs = self.md.read_metrics()
        if self.md.validation is not None and validation_steps:
            self.runner.evaluate(validation_steps)
            logs.update(self.md.read_metrics("val_"))
        self.checkpoints.write_scalars(logs, epoch)
        job = self.md.job
        checkpoint = None
        if (epoch + 1) % job.checkpoint_every == 0 or epoch + 1 == job.epochs:
            checkpoint = self.checkpoints.save(epoch + 1, 0, self.global_step)
        return logs, checkpoint

    def save(self, epoch: int, step: int) -> str | None:
        """A checkpoint at ``step`` of ``epoch`` (mid-epoch, for failure recovery)."""
        return self.checkpoints.save(epoch, step, self.global_step)

    def final(self, with_model: bool) -> dict[str, Any]:
        return {
            **self.md.final(with_model),
            "throughput": self.throughput,
            "first_step_at": self.runner.clock.first_step_at,
        }


def strategy_loop(
    spec: StrategySpec, job: Job, devices: list[str], strategy: Any, preempted: Callable[[], bool]
) -> tuple[TrainLoop, dict[str, Any]]:
    """A loop for one worker of an in-graph or all-reduce layout, built and restored; with
    what the driver must agree on (steps, the epoch and step to start from)."""
    towers = strategy is None and len(devices) > 1
    if strategy is not None:
        replicas = strategy.num_replicas_in_sync // spec.num_workers
    else:
        replicas = len(devices)
    distribute = strategy is not None
    strategy = strategy or tf.distribute.get_strategy()
    ctx = InputContext(
        worker_index=spec.worker_index,
        num_workers=spec.num_workers,
        replicas_per_worker=replicas,
        global_batch_size=job.global_batch_size,
        seed=job.seed,
    )
    val_ctx = InputContext(**{**ctx.__dict__, "training": False})
    md = ModelData(job, strategy, ctx, val_ctx, towers, 1 if towers else replicas)
    info = md.build()
    checkpoints = Checkpoints(
        job.checkpoint_dir, spec.is_chief, spec.worker_index, model=md.model, optimizer=md.optimizer
    )
    start = checkpoints.restore() if job.resume else (0, 0)
    runner = StrategyRunner(md, devices, towers, distribute, job)
    agreement = Agreement(strategy, spec.worker_index, spec.num_workers, replicas)
    loop = TrainLoop(md, runner, checkpoints, agreement, preempted)
    info.update(
        replicas_per_worker=replicas,
        start_epoch=start[0],
        start_step=start[1],
        restored=checkpoints.restored,
        skipped_checkpoints=checkpoints.skipped,
    )
    return loop, info


def run_in_process(spec: StrategySpec, job: Job) -> tuple[TrainLoop, list[dict[str, Any]]]:
    """Run ``job`` in this process without Ray: the loop "by hand", for benchmarks and tests.

    Must be the first TensorFlow work in the process (devices and strategies are set once).
    """
    devices, _ = configure_devices(spec)
    strategy = make_strategy(spec, devices)
    loop, info = strategy_loop(spec, job, devices, strategy, lambda: False)
    steps = job.steps_per_epoch or info["train_steps"]
    val_steps = job.validation_steps or info["validation_steps"]
    epochs = [loop.run_epoch(e, steps, val_steps) for e in range(info["start_epoch"], job.epochs)]
    return loop, epochs

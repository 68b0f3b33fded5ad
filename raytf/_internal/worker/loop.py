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
from raytf._internal.worker.keras_callbacks import KerasHooks
from raytf._internal.worker.model import WHOLE, ModelData
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

    def train(self, steps: int, block: Block) -> int: ...
    def evaluate(self, validation_steps: int) -> None: ...
    def seek(self, batches: int) -> None: ...


class Block(Protocol):
    """What the loop does around each executed block of steps (one tf.function call)."""

    def go_on(self, done: int) -> bool:
        """Before the block that starts ``done`` steps into the segment: train on?"""

    def begin(self, done: int) -> None: ...
    def end(self, done: int, n: int) -> None: ...


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
        evaluate = S.eval_step(md, replicated=not towers)
        self._eval_n, self._eval_all = S.loop_of(evaluate), S.loop_all(evaluate)
        self._val = None
        if md.validation is not None:
            once = md.validation.prefetch(tf.data.AUTOTUNE)
            self._val = self._distribute(once.repeat())
            self._val_once = self._distribute(once)
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

    def train(self, steps: int, block: Block) -> int:
        """Up to ``steps`` steps, fewer if ``block`` says stop; the steps trained."""
        k = steps_per_call(self.job, steps)
        done = 0
        while done < steps and block.go_on(done):
            n = min(k, steps - done) if self.clock.warm else 1  # trace on one step
            block.begin(done)
            t0 = time.perf_counter()
            self._train_n(self._iterator, tf.constant(n)).numpy()
            self.clock.record(n, t0)
            block.end(done, n)
            done += n
        return done

    def evaluate(self, validation_steps: int) -> None:
        if validation_steps == WHOLE:
            self._eval_all(self._val_once).numpy()
        else:
            self._eval_n(iter(self._val), tf.constant(validation_steps)).numpy()


class _Segment:
    """The :class:`Block` of one segment: Keras batch hooks, and the per-call agreement on
    who got SIGTERM and whether ``model.stop_training`` was set (every worker stops at the
    same step either way)."""

    def __init__(self, loop: TrainLoop, epoch: int, start: int, steps: int) -> None:
        self.loop, self.epoch, self.start, self.steps = loop, epoch, start, steps
        self.stopped = False

    def go_on(self, done: int, signals: bool = True) -> bool:
        """``signals``: SIGTERM counts too (not after the segment's last block: the
        controller's next segment or save sees it at a step that starts work)."""
        step = self.start + done
        self.stopped = self.loop.agreed_stop(self.epoch, step, self.steps, signals)
        return not self.stopped

    def begin(self, done: int) -> None:
        self.loop.hooks.batch_begin(self.start + done)

    def end(self, done: int, n: int) -> None:
        hooks = self.loop.hooks
        if hooks.batch_hooks:  # Keras' batch index: the block's last step
            hooks.batch_end(self.start + done + n - 1, self.loop.md.current_metrics())


class TrainLoop:
    """One worker's epochs: ``runner`` steps, ``checkpoints`` saves, ``agreement`` stops
    every worker at the same step on SIGTERM or ``stop_training`` (``preempted`` reads this
    process's flag), ``hooks`` runs the user's Keras callbacks."""

    def __init__(
        self,
        md: ModelData,
        runner: Runner,
        checkpoints: Checkpoints,
        agreement: Agreement | None = None,
        preempted: Callable[[], bool] = lambda: False,
        hooks: KerasHooks | None = None,
    ) -> None:
        self.md, self.runner, self.checkpoints = md, runner, checkpoints
        self.agreement = agreement
        self.preempted = preempted
        self.hooks = hooks or KerasHooks((), md.model, True, md.job.epochs, None)
        self.last_logs: dict[str, float] = {}

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
        end (or where every worker agreed to stop) validate, call the epoch's callbacks and
        checkpoint. Returns logs (None mid-epoch), this worker's rate and learning rate."""
        stop = steps if stop is None else stop
        if start == 0:
            self.md.reset_metrics()
            self.hooks.epoch_begin(epoch)
        block = _Segment(self, epoch, start, steps)
        done = self.runner.train(stop - start, block)
        if not block.stopped and self.hooks.batch_hooks:  # set by the last block's hooks?
            block.go_on(done, signals=False)
        out: dict[str, Any] = {"logs": None, "checkpoint": None, "stopped_at": None}
        if stop >= steps or block.stopped:
            # Stopped mid-epoch: the epoch ends here, as Keras ends it (callbacks, checkpoint).
            out["logs"], out["checkpoint"] = self._end_epoch(epoch, validation_steps)
            if start + done < steps:
                out["stopped_at"] = start + done
        return {
            **out,
            "throughput": self.throughput,
            "global_step": self.global_step,
            "stop_training": self.hooks.stop,
            "learning_rate": self.hooks.learning_rate(),
        }

    def agreed_stop(self, epoch: int, step: int, epoch_steps: int, signals: bool = True) -> bool:
        """Agree with every worker before a block: SIGTERM (checkpoint at this step and
        leave, raising Preempted) or ``stop_training`` (True: stop here, all of them)."""
        stop = self.hooks.stop
        if self.agreement is None:
            return stop
        collective = self.checkpoints.manager is not None or self.hooks.batch_hooks
        preempted = signals and self.preempted()
        stopping, stop = self.agreement.stopping(preempted, stop, collective)
        if stopping:  # SIGTERM: every worker saves at this same step, then they leave
            save = self.save if self.checkpoints.manager is not None else None
            self.agreement.stop(stopping, epoch, step, epoch_steps, save)
        if stop:
            self.md.model.stop_training = True
        return stop

    def _end_epoch(self, epoch: int, validation_steps: int | None) -> tuple[dict, str | None]:
        """Metrics, validation, the epoch's callbacks, TensorBoard and the checkpoint of a
        finished (or stopped) epoch."""
        logs = self.md.read_metrics()
        if self.md.validation is not None and validation_steps:
            self.hooks.test_begin()
            self.runner.evaluate(validation_steps)
            val_logs = self.md.read_metrics("val_")
            self.hooks.test_end({k[4:]: v for k, v in val_logs.items()})
            logs.update(val_logs)
        # Callbacks first: a learning rate they change is the one the checkpoint holds.
        logs = self.hooks.epoch_end(epoch, logs)
        self.last_logs = logs
        self.checkpoints.write_scalars(logs, epoch)
        job = self.md.job
        checkpoint = None
        if (epoch + 1) % job.checkpoint_every == 0 or epoch + 1 == job.epochs or self.hooks.stop:
            checkpoint = self.checkpoints.save(epoch + 1, 0, self.global_step)
        return logs, checkpoint

    def save(self, epoch: int, step: int) -> str | None:
        """A checkpoint at ``step`` of ``epoch`` (mid-epoch, for failure recovery)."""
        return self.checkpoints.save(epoch, step, self.global_step)

    def set_learning_rate(self, value: float) -> None:
        self.hooks.set_learning_rate(value)

    def final(self, with_model: bool) -> dict:
        """The model (after ``on_train_end``: EarlyStopping may restore its best weights)
        and, from the chief, the callbacks' state for the user's objects."""
        self.hooks.train_end(self.last_logs)
        return {
            **self.md.final(with_model),
            "throughput": self.throughput,
            "first_step_at": self.runner.clock.first_step_at,
            "keras_callbacks": self.hooks.states() if with_model else None,
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
    if towers and md.custom_train and spec.auto:
        # "auto" picked towers, which cannot run the model's own train_step: mirrored can,
        # over the same devices (nothing ran in a strategy yet, so it may start here).
        towers, distribute = False, True
        strategy = tf.distribute.MirroredStrategy(devices=devices)
        md = ModelData(job, strategy, ctx, val_ctx, False, replicas)
        info = md.build()
        info["note"] = (
            "The model overrides train_step, which towers cannot run: its replicas run "
            "under MirroredStrategy instead."
        )
    checkpoints = Checkpoints(
        job.checkpoint_dir,
        spec.is_chief,
        spec.worker_index,
        job.keep_checkpoints,
        model=md.model,
        optimizer=md.optimizer,
    )
    start = checkpoints.restore() if job.resume else (0, 0)
    runner = StrategyRunner(md, devices, towers, distribute, job)
    agreement = Agreement(strategy, spec.worker_index, spec.num_workers, replicas)
    steps = job.steps_per_epoch or info["train_steps"]
    hooks = KerasHooks(
        job.keras_callbacks, md.model, spec.is_chief, job.epochs, steps, checkpoints.restored
    )
    loop = TrainLoop(md, runner, checkpoints, agreement, preempted, hooks)
    hooks.train_begin()
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
    epochs = []
    for e in range(max(info["start_epoch"], job.initial_epoch), job.epochs):
        epochs.append(loop.run_epoch(e, steps, val_steps if job.validates(e) else None))
        if epochs[-1]["stop_training"]:
            break
    return loop, epochs

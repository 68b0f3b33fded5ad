"""The worker actor of raytf's parameter-server backend: pull weights, compute, push gradients.

Transfer is what a parameter-server step pays for, so the loop keeps round trips to one per
step: a push returns the weights for the next step (synchronous mode, and asynchronous modes
without prefetch). With ``prefetch_weights`` and staleness >= 1 the next pull is in flight
while this step computes and the push does not wait for an answer, so transfer overlaps compute.
Arrays travel as flat float32 buffers over TCP, or through Ray's object store (wire.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from raytf._internal.job import Job
from raytf._internal.spec import StrategySpec
from raytf._internal.worker.process import Process, surface_errors


class PSWorker:
    """One worker against the parameter servers. A plain class made an actor at spawn."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc = Process(name)

    def ready(self) -> dict[str, Any]:
        return self.proc.info()

    @surface_errors
    def start(self, spec: StrategySpec) -> dict[str, Any]:
        from raytf._internal.worker.devices import configure_devices

        self.spec = spec
        devices, kind = configure_devices(spec)
        return {"devices": devices, "device_kind": kind}

    @surface_errors
    def build(self, job: Job) -> dict[str, Any]:
        from raytf._internal.backends.ray_ps.step import GradientStep

        # The servers own variables, optimizer state and checkpoints; workers keep none.
        from raytf._internal.worker.keras_callbacks import KerasHooks

        self.step = GradientStep(
            self.spec, dataclasses.replace(job, checkpoint_dir=None, resume=False)
        )
        info = self.step.build()
        steps = job.steps_per_epoch or info["train_steps"]
        self.hooks = KerasHooks(
            job.keras_callbacks, self.step.md.model, self.spec.is_chief, job.epochs, steps
        )
        self.last_logs: dict[str, float] = {}
        return info

    @surface_errors
    def variables(self) -> list[dict[str, Any]]:
        return self.step.variables_info()

    @surface_errors
    def connect(
        self, servers: list[Any], server_names: list[str], owner: list[int], config: dict[str, Any]
    ) -> None:
        """Learn the servers and which shared variable each owns (``owner[i]``)."""
        from raytf._internal.backends.ray_ps.wire import TCP, open_channels

        self.index = self.spec.worker_index
        old = getattr(self, "channels", [])
        self.channels = open_channels(
            config.get("transport", TCP),
            servers,
            server_names,
            config.get("addresses") or [None] * len(servers),
            self.name,
        )
        for channel in old:
            channel.close()
        self.staleness = config["staleness"]
        self.prefetch = bool(config["prefetch_weights"]) and self.staleness != 0
        self.step.connect(owner, len(servers))
        if config.get("learning_rate") is not None:  # the servers' rate: callbacks go on from it
            self.hooks.set_learning_rate(config["learning_rate"])
        self.hooks.train_begin()
        self.versions = [0] * len(servers)  # of the weights the current step computes on
        self.steps = 0  # steps this worker has started, across epochs
        self.generation = 0  # bumped by the servers each time this worker is replaced
        self.epoch_steps = 0  # steps this worker trained in the current epoch
        self._next: list[Any] | None = None  # refs that answer with the next step's weights
        self._acks: list[Any] = []
        self.timing = {"wait_s": 0.0, "compute_s": 0.0, "push_s": 0.0, "steps": 0}

    @surface_errors
    def rejoin(self, step: int, generation: int, offset: int) -> None:
        """Replace a dead worker of this index: it had pushed ``step`` batches since its
        data started at batch ``offset`` (this attempt's restored position)."""
        self.step.seek(offset + step)
        self.steps = step
        self.generation = generation

    @surface_errors
    def seek(self, batches: int) -> None:
        self.step.seek(batches)

    # ------------------------------------------------------------------ traffic
    def _pull(self, step: int | None) -> list[Any]:
        """Ask every server for its weights for this worker's ``step`` (None: now)."""
        return [c.pull(self.index, step) for c in self.channels]

    def _weights(self, pending: list[Any]) -> tuple[list[Any], bool]:
        """Each server's flat weights, and whether every server says the epoch is over."""
        flats, done = [], []
        for s, reply in enumerate(pending):
            version, values, finished = reply.result()
            self.versions[s] = version
            flats.append(values)
            done.append(finished)
        return flats, all(done)

    def _push(self, flats: list[Any], want: bool) -> list[Any]:
        return [
            c.push(self.index, self.versions[s], flats[s], want, self.generation)
            for s, c in enumerate(self.channels)
        ]

    def _drain(self) -> None:
        """Wait for the previous push's acknowledgements: errors surface, memory stays bounded."""
        for ack in self._acks:
            ack.result()
        self._acks = []

    # ------------------------------------------------------------------ epochs
    @surface_errors
    def run_epoch(
        self,
        epoch: int,
        steps: int,
        validation_steps: int | None,
        start: int = 0,
        stop: int | None = None,
    ) -> dict[str, Any]:
        """Train until the servers say the segment's global steps (``start``..``stop`` of
        the epoch's ``steps``; each a step of every worker in synchronous training, a worker
        batch otherwise) are done. Metrics cover the epoch; they are read at its end."""
        md, clock, timing = self.step.md, self.step.clock, self.timing
        stop = steps if stop is None else stop
        if start == 0:
            md.reset_metrics()
            self.epoch_steps = 0
        while True:
            t0 = time.perf_counter()
            weights, over = self._weights(self._next or self._pull(self.steps))
            self._next = None
            if over:
                break
            if self.prefetch:
                self._next = self._pull(self.steps + 1)  # overlaps this step's compute
            t1 = time.perf_counter()
            self.hooks.batch_begin(self.epoch_steps)
            grads = self.step.gradients(weights)
            if self.hooks.batch_hooks:
                self.hooks.batch_end(self.epoch_steps, md.current_metrics())
            t2 = time.perf_counter()
            self._drain()  # at most one push in flight
            refs = self._push(grads, want=not self.prefetch)
            if self.prefetch:
                self._acks = refs
            else:
                self._next = refs  # the push answers with the next step's weights
            self.steps += 1
            self.epoch_steps += 1
            t3 = time.perf_counter()
            if clock.warm:
                timing["wait_s"] += t1 - t0
                timing["compute_s"] += t2 - t1
                timing["push_s"] += t3 - t2
                timing["steps"] += 1
            clock.record(1, t0)
        self._drain()
        logs, val_examples = None, None
        if stop >= steps:  # the epoch's end
            logs = md.read_metrics()
            if validation_steps and md.validation is not None:
                self.step.assign(self._weights(self._pull(None))[0])
                logs.update(self.step.evaluate(validation_steps))
                val_examples = self.step.val_examples
        return {
            "logs": logs,
            "throughput": clock.throughput(md.ctx.worker_batch_size),
            "checkpoint": None,
            "global_step": max(self.versions),
            "steps": self.epoch_steps,  # this worker's share of the epoch (weighs its logs)
            "val_examples": val_examples,  # its validation shard's size (weighs val_ logs)
        }

    # ------------------------------------------------------------ Keras callbacks
    @surface_errors
    def begin_epoch(self, epoch: int) -> float | None:
        """``on_epoch_begin`` before any worker's first step: the learning rate it leaves
        (a scheduler's), which the driver gives the servers before the epoch starts."""
        self.hooks.epoch_begin(epoch)
        return self.hooks.learning_rate()

    @surface_errors
    def end_epoch(self, epoch: int, logs: dict[str, float]) -> dict[str, Any]:
        """``on_epoch_end`` on the global ``logs``, with the servers' weights in the model
        (what EarlyStopping keeps and ModelCheckpoint writes): the decisions it took."""
        if self.hooks.callbacks:
            self.step.assign(self._weights(self._pull(None))[0])
        self.last_logs = self.hooks.epoch_end(epoch, logs)
        return {
            "logs": self.last_logs,
            "stop_training": self.hooks.stop,
            "learning_rate": self.hooks.learning_rate(),
        }

    @surface_errors
    def final(self, with_model: bool) -> dict[str, Any]:
        """The model with the servers' latest weights (or, after ``on_train_end``, the ones
        a callback restored), and this worker's step rate."""
        self.step.assign(self._weights(self._pull(None))[0])
        self.hooks.train_end(self.last_logs)
        md, clock, t = self.step.md, self.step.clock, self.timing
        seconds = t["wait_s"] + t["compute_s"] + t["push_s"]
        return {
            **md.final(with_model),
            "throughput": clock.throughput(md.ctx.worker_batch_size),
            "first_step_at": clock.first_step_at,
            "steps_per_second": t["steps"] / seconds if seconds else None,
            "timing": {k: round(v, 4) if isinstance(v, float) else v for k, v in t.items()},
            "keras_callbacks": self.hooks.states() if with_model else None,
        }

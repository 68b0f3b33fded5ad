"""The controller's state machine, stepped one state at a time with a scripted backend, a fake
actor group and a fake placer: the recovery, elastic and port-retry paths, without Ray or TF.

The end-to-end versions of each path (real actors, real kills) are in test_faults.py and
test_elastic.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import pytest

import raytf
from raytf._internal.job import Job
from raytf._internal.runtime.backend import Backend, Built, EpochEnd, Report
from raytf._internal.runtime.controller import BIND_FAILURE, Controller, State
from raytf.errors import PlacementError, WorkerError
from raytf.layouts.base import Layout

STEPS = 4  # per epoch


def lost(worker: str) -> WorkerError:
    return WorkerError(f"{worker} died", worker=worker, error_type="RayActorError")


class Script:
    """What the fake backend does and what it saw; shared by every attempt's backend."""

    def __init__(self) -> None:
        self.fail_at: dict[tuple[int, int], BaseException] = {}  # (epoch, start) -> error
        self.bind_failures = 0
        self.saved: int | None = None  # position of the newest checkpoint
        self.trained: list[tuple[int, int, int, int]] = []  # (workers, epoch, start, stop)
        self.builds: list[tuple[int, bool, int]] = []  # (workers, resume, global batch)
        self.replace_at: tuple[int, int] | None = None
        self.stop_after: int | None = None  # the epoch whose callbacks stop training
        self.begun: list[int] = []  # epochs begun (begin_epoch)


@dataclass(frozen=True)
class FakeLayout(Layout):
    name: ClassVar[str] = "fake"
    workers: int = 2
    script: Any = None
    backend: Any = None  # a FakeBackend subclass for one test

    @property
    def num_workers(self) -> int:
        return self.workers

    @property
    def devices_per_worker(self) -> int:
        return 1

    def bundles(self) -> list[dict[str, float]]:
        return [{"CPU": 1.0}] * self.workers

    def strategy_specs(self, addresses):
        return []

    @classmethod
    def for_replicas(cls, replicas, use_gpu, **options):
        return cls(workers=replicas, **options)

    def resized(self, workers: int) -> FakeLayout:
        return replace(self, workers=workers)

    def backend_cls(self) -> type[Backend]:
        return self.backend or FakeBackend


class FakeBackend(Backend):
    mid_epoch_checkpoints = True

    @property
    def script(self) -> Script:
        return self.layout.script

    def spawn(self, group):
        group.spawned.append(self.layout.workers)

    def start(self, group):
        if self.script.bind_failures:
            self.script.bind_failures -= 1
            raise WorkerError(f"worker-1 failed: UnknownError: {BIND_FAILURE}")
        return [{"name": f"worker-{i}", "pid": 100 + i} for i in range(self.layout.workers)], []

    def build(self, group, job: Job, recovering: bool) -> Built:
        self.script.builds.append((self.layout.workers, job.resume, job.global_batch_size))
        position = self.script.saved if job.resume and self.script.saved is not None else 0
        epoch, step = divmod(position, STEPS)
        restored = f"ckpt-{position}" if job.resume and self.script.saved is not None else None
        return Built(STEPS, None, epoch, step, restored)

    def seek(self, group, position):
        pass

    def train(self, group, segment, timeout_s):
        key = (segment.epoch, segment.start)
        self.script.trained.append((self.layout.workers, *key, segment.stop))
        error = self.script.fail_at.pop(key, None)
        if error is not None:
            raise error
        if self.script.replace_at == key:
            with self.hooks.replacing(lost("worker-1")):
                pass
            self.hooks.replaced({"pid": 999, "node_ip": "n", "node_id": "i"}, 0, 3)
        logs = {"loss": 1.0 / (segment.epoch + 1)} if segment.ends_epoch else None
        return [{"logs": logs, "throughput": 1.0, "checkpoint": None, "global_step": 0}]

    def save(self, group, epoch, step):
        self.script.saved = epoch * STEPS + step
        return f"ckpt-{self.script.saved}"

    def begin_epoch(self, group, epoch):
        self.script.begun.append(epoch)

    def end_epoch(self, group, epoch, results, logs):
        self.script.saved = (epoch + 1) * STEPS
        return EpochEnd(f"ckpt-{self.script.saved}", logs, epoch == self.script.stop_after)

    def report(self, group):
        return Report(finals=[{"throughput": 1.0, "first_step_at": None, "weights": []}])


class FakeGroup:
    spawned: list[int] = []
    shutdowns: list[int] = []

    def __init__(self, placement, bundles, runtime_env=None, strategy="PACK"):
        self.placement = placement

    def spawn(self, *args):  # pragma: no cover - the fake backend does not spawn
        pass

    def shutdown(self, park=False):
        FakeGroup.shutdowns.append(1)

    def start_spares(self, may_recover):
        return 0

    def drop_spares(self):
        pass


class FakePlacer:
    def __init__(self, capacity: int = 2) -> None:
        self.capacity = capacity  # workers that fit
        self.released = 0

    def reserve(self, layout, timeout_s):
        if layout.num_workers > self.capacity:
            raise PlacementError(f"{layout.num_workers} do not fit")
        return f"pg-{layout.num_workers}"

    def release(self, placement):
        self.released += placement is not None

    def has_free(self, bundles):
        return len(bundles) + 1 <= self.capacity

    def probe(self, bundles, strategy):
        return True


def controller(
    script: Script, epochs=2, workers=2, placer=None, backend=None, job=None, **policy
) -> Controller:
    FakeGroup.spawned, FakeGroup.shutdowns = [], []
    job = job or Job(model_fn=print, data_fn=print, global_batch_size=8, epochs=epochs)
    return Controller(
        FakeLayout(workers=workers, script=script, backend=backend),
        job,
        raytf.Timeouts(),
        "test",
        failures=raytf.FailurePolicy(**policy),
        group_cls=FakeGroup,
        placer=placer or FakePlacer(),
    )


def run_states(c: Controller) -> list[str]:
    states = [c.state.value]
    try:
        while c.state is not State.DONE:
            states.append(c.step().value)
    finally:
        c.close()
    return states


def test_segments_follow_the_policy_and_end_done():
    script = Script()
    c = controller(script, checkpoint_every_steps=3)
    assert run_states(c) == ["start", "train", "train", "train", "train", "train", "done"]
    assert [t[1:] for t in script.trained] == [(0, 0, 3), (0, 3, 4), (1, 0, 3), (1, 3, 4)]
    assert c.result.history["loss"] == [1.0, 0.5] and c.result.failures == []
    assert c.result.steps_trained == 2 * STEPS


def test_a_callbacks_stop_ends_the_run_after_that_epoch_and_epochs_begin_once():
    script = Script()
    script.stop_after = 1
    c = controller(script, epochs=5, checkpoint_every_steps=3)
    assert run_states(c)[-1] == "done"
    assert script.begun == [0, 1]  # once per epoch, not per segment
    assert {t[1] for t in script.trained} == {0, 1}
    assert c.result.epochs_trained == 2 and len(c.result.history["loss"]) == 2


def test_validation_freq_and_initial_epoch_shape_the_segments():
    script = Script()
    job = Job(
        model_fn=print,
        data_fn=print,
        validation_fn=print,
        global_batch_size=8,
        epochs=5,
        validation_freq=2,
        initial_epoch=1,
    )

    class Validating(FakeBackend):
        def build(self, group, job, recovering):
            return Built(STEPS, 2, job.initial_epoch, 0)

        def train(self, group, segment, timeout_s):
            script.trained.append((segment.epoch, segment.validation_steps))
            return [{"logs": {"loss": 1.0}, "throughput": 1.0, "global_step": 0}]

    c = controller(script, job=job, backend=Validating)
    run_states(c)
    # Epochs 2..5 (Keras counts from initial_epoch); validation after every 2nd epoch.
    assert script.trained == [(1, 2), (2, None), (3, 2), (4, None)]
    assert c.result.epochs_trained == 4


def test_a_lost_worker_restarts_the_group_from_the_newest_checkpoint():
    script = Script()
    script.fail_at[(1, 2)] = lost("worker-1")
    c = controller(script, max_failures=1, checkpoint_every_steps=2)
    states = run_states(c)
    assert states[states.index("recover") - 1 : states.index("recover") + 2] == [
        "train", "recover", "start",
    ]  # fmt: skip
    assert script.builds == [(2, False, 8), (2, True, 8)]  # the restart resumes
    (record,) = c.result.failures
    assert (record.worker, record.reason, record.epoch, record.segment) == (
        "worker-1",
        "died",
        1,
        (2, 4),
    )
    assert record.action == "restarted the group"
    # The checkpoint at epoch 1 step 2 came back; the failed segment reached step 4 at most.
    assert (record.restored_epoch, record.restored_step, record.steps_redone) == (1, 2, 2)
    assert record.restarted_on[0] == {"name": "worker-0", "pid": 100}
    assert c.result.history["loss"] == [1.0, 0.5]  # epoch 1 counted once
    assert len(FakeGroup.shutdowns) == 2  # the failed group and the final one


def test_failures_beyond_the_budget_and_bugs_are_raised():
    script = Script()
    script.fail_at[(0, 0)] = lost("worker-0")
    with pytest.raises(WorkerError, match="worker-0 died"):
        run_states(controller(script, max_failures=0))
    script = Script()
    script.fail_at[(0, 0)] = raytf.ConfigError("a bug in the data function")
    c = controller(script, max_failures=3)
    with pytest.raises(raytf.ConfigError, match="a bug"):
        run_states(c)
    assert c.run_state.failures == [] and FakeGroup.shutdowns  # never retried, torn down


@pytest.mark.parametrize(("lost_binds", "groups"), [(2, 3), (5, 3)])
def test_a_lost_port_retries_with_a_fresh_group(lost_binds, groups):
    script = Script()
    script.bind_failures = lost_binds
    c = controller(script, epochs=1)
    if lost_binds < 3:
        assert run_states(c)[-1] == "done"
    else:
        with pytest.raises(WorkerError, match=BIND_FAILURE):
            run_states(c)
    assert len(FakeGroup.spawned) == groups  # three attempts at most
    assert len(FakeGroup.shutdowns) >= groups  # every attempt's group was torn down


def test_a_replacement_in_place_is_recorded_without_a_restart():
    script = Script()
    script.replace_at = (0, 0)
    c = controller(script, epochs=1, max_failures=1)
    assert "recover" not in run_states(c)
    (record,) = c.result.failures
    assert record.action == "replaced in place" and record.replacement["pid"] == 999
    assert record.resumed_batch == 3 and record.steps_redone == 0 and record.partial == 0


def test_elastic_shrinks_when_resources_are_gone_and_grows_when_they_return():
    script = Script()
    script.fail_at[(0, 2)] = lost("worker-1")
    placer = FakePlacer(capacity=2)

    c = controller(script, epochs=3, workers=2, placer=placer, max_failures=1,
                   min_workers=1, checkpoint_every_steps=2, replace_within_s=1)  # fmt: skip
    while c.state is not State.RECOVER:
        c.step()
    placer.capacity = 1  # the lost worker's node is gone
    assert c.step() is State.RESIZE and c.step() is State.START
    assert c.layout.num_workers == 1
    (shrink,) = c.run_state.resizes
    assert (shrink.from_workers, shrink.to_workers, shrink.reason) == (
        1 + 1,
        1,
        "replacements unavailable",
    )
    placer.capacity = 2  # the node is back: the next boundary grows the run
    states = run_states(c)
    assert "resize" in states and c.layout.num_workers == 2 and states[-1] == "done"
    grow = c.run_state.resizes[1]
    assert (grow.from_workers, grow.to_workers, grow.reason) == (1, 2, "resources returned")
    assert [b[0] for b in script.builds] == [2, 1, 2]
    assert c.result.steps_trained >= 3 * STEPS


def test_a_failure_while_starting_charges_no_time_before_the_run():
    script = Script()

    class DiesInBuild(FakeBackend):
        def build(self, group, job, recovering):
            if not recovering:
                raise lost("worker-0")
            return super().build(group, job, recovering)

    c = controller(script, epochs=1, max_failures=1, backend=DiesInBuild)
    run_states(c)
    (record,) = c.result.failures
    # Charged from the run's start (no checkpoint yet), not from the epoch of the clock.
    assert 0 <= record.since_checkpoint_s <= record.detected_at - c.run_state.started
    assert record.segment == (0, 0) and record.partial == 0


def test_tensorflow_ps_chief_or_ps_task_death_ends_the_attempt():
    from raytf._internal.backends.tf_ps.backend import TFParameterServerBackend
    from raytf._internal.runtime.group import Member

    backend = TFParameterServerBackend(
        raytf.ParameterServer(staleness=None, backend="tensorflow"), raytf.Timeouts(), None
    )
    backend.specs = raytf.ParameterServer(staleness=None, backend="tensorflow").strategy_specs(
        [f"127.0.0.1:{5000 + i}" for i in range(4)]
    )

    class Group:
        def of(self, role):
            return tasks

    tasks = [Member(f"worker-{i}", "task", i, object) for i in range(2)]
    tasks.append(Member("ps-0", "task", 2, object))
    chief = Member("chief", "chief", 3, object)
    for member in (chief, tasks[2]):  # no in-place restart: a recoverable error, raised
        error = lost(member.name)
        with pytest.raises(WorkerError) as raised:
            backend._restart_task(Group(), member, error)
        assert raised.value is error


@pytest.mark.parametrize(
    ("steps", "policy", "rate", "mid_epoch", "length"),
    [
        (10, {}, None, True, 10),  # no interval: whole epochs
        (10, {"checkpoint_every_steps": 4}, None, True, 4),
        (10, {"checkpoint_every_steps": 40}, None, True, 10),
        (100, {"checkpoint_every_s": 2.0}, None, True, 10),  # no rate yet: a tenth
        (100, {"checkpoint_every_s": 2.0}, 7.5, True, 15),  # 2 s at 7.5 steps/s
        (10, {"checkpoint_every_steps": 4}, None, False, 10),  # backend runs whole epochs
    ],
)
def test_segment_length(steps, policy, rate, mid_epoch, length):
    from raytf._internal.runtime.schedule import segment_length

    assert segment_length(steps, raytf.FailurePolicy(**policy), rate, mid_epoch) == length


def test_a_preemption_restored_where_it_stopped_redoes_nothing():
    from raytf._internal.runtime import recovery
    from raytf._internal.runtime.schedule import Segment

    error = raytf.Preempted("worker-1 got SIGTERM", checkpoint="c", position=13, worker="worker-1")
    record = recovery.detected(
        error, 1, Segment(0, 8, 16, 16), 8, 16, checkpoint_time=90.0, now=100
    )
    assert (record.reached, record.partial, record.since_checkpoint_s) == (16, 8, 10.0)
    done = recovery.restarted(record, position=13, steps=16, restored="c", skipped=(),
                              workers=[{"name": "worker-0", "pid": 1}], now=103.5)  # fmt: skip
    assert (done.reached, done.partial, done.steps_redone) == (13, 5, 0)
    assert (done.restored_epoch, done.restored_step, done.time_lost_s) == (0, 13, 3.5)


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        (None, None),  # not inside a caller's placement group
        # Tune drops an empty head bundle: the layout's bundles from index 0.
        ([{"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}, {"CPU": 1}], 0),
        # A real head bundle first: the layout's bundles after it.
        ([{"CPU": 1}, {"CPU": 1, "GPU": 1}, {"CPU": 1, "GPU": 1}, {"CPU": 1}], 1),
        # Bundles that cannot hold the layout's in order: left to Ray.
        ([{"CPU": 1}, {"CPU": 1}, {"CPU": 1}], None),
    ],
)
def test_actors_are_pinned_to_their_bundles_in_a_callers_placement_group(
    monkeypatch, group, expected
):
    """Inside a Tune trial each actor takes bundle offset + its index, so a CPU-only server
    cannot take the CPU of a GPU worker's bundle and leave that worker pending."""
    import importlib

    from raytf._internal.runtime.group import _caller_group

    pg_module = importlib.import_module("ray.util.placement_group")  # not ray.util's function

    class Group:
        bundle_specs = group

    monkeypatch.setattr(
        pg_module, "get_current_placement_group", lambda: None if group is None else Group()
    )
    layout = raytf.ParameterServer(workers=2, ps=1, use_gpu=True).bundles()
    placement, offset = _caller_group(layout)
    if expected is None:
        assert (placement, offset) == (None, 0)
    else:
        assert isinstance(placement, Group) and offset == expected


def test_only_the_drivers_own_modules_get_the_ship_it_advice(tmp_path, monkeypatch):
    from raytf._internal.runtime.group import unwrap

    def raised_in_actor(module: str) -> WorkerError:
        return WorkerError(
            f"worker failed in build: ModuleNotFoundError: No module named '{module}'",
            worker="worker",
            error_type="ModuleNotFoundError",
        )

    # A typo, or a package installed nowhere: the user's own error, as it was raised.
    typo = raised_in_actor("kerass")
    assert unwrap(typo, "worker") is typo
    # An installed package (numpy is in the driver's site-packages): not "ship your module".
    assert unwrap(raised_in_actor("numpy"), "worker") is not None
    assert isinstance(unwrap(raised_in_actor("numpy"), "worker"), WorkerError)
    # A module of the user's project, importable here but not in the actors: the fix.
    (tmp_path / "my_project_models.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    advice = unwrap(raised_in_actor("my_project_models"), "worker")
    assert isinstance(advice, raytf.ConfigError)
    assert "runtime_env" in str(advice) and str(tmp_path) in str(advice)

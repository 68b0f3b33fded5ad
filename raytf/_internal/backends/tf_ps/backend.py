"""Driver side of TensorFlow's parameter-server backend: every task an actor, the chief drives.

Failures: the driver holds a blocking ``serve`` call on every task, so a task's death is seen
at once, not when TensorFlow gives up on it. A dead ``worker`` task is started again at the
same address while the chief trains on: TensorFlow's coordinator reschedules the lost closures
on the other workers and takes the new task back (re-creating its dataset) when it answers.
A dead ``ps`` task loses variables, the ``UnavailableError`` TensorFlow leaves to the user:
the attempt ends and the controller restarts every task from the chief's newest checkpoint.
"""

from __future__ import annotations

from typing import Any

from raytf._internal.backends.collective import agree
from raytf._internal.backends.tf_ps.tasks import TFChief, TFServerTask
from raytf._internal.job import Job
from raytf._internal.runtime.backend import Backend, Built, EpochEnd, Report
from raytf._internal.runtime.group import ActorGroup, Member
from raytf._internal.runtime.schedule import Segment
from raytf.config import AUTO_STEPS_PER_EXECUTION


class TFParameterServerBackend(Backend):
    """Worker and ps tasks serve; after start-up every call goes to the chief alone."""

    mid_epoch_checkpoints = False  # TensorFlow's coordinator runs whole epochs of closures

    def spawn(self, group: ActorGroup) -> None:
        for i, (role, index) in enumerate(self.layout.roles()):
            if role == "chief":
                group.spawn("chief", "chief", i, TFChief)
            else:
                group.spawn(f"{role}-{index}", "task", i, TFServerTask)

    def _chief(self, group: ActorGroup, method: str, *args: Any, phase: str = "start") -> Any:
        chief = group.of("chief")
        return group.call(chief, method, [args], timeout_s=self.timeouts.start_s, phase=phase)[0]

    def start(self, group: ActorGroup) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Tasks first (the chief connects to them), then the chief."""
        t, members = self.timeouts, group.members
        ready = group.call(members, "ready", timeout_s=t.start_s, phase="start")
        addresses = group.call(members, "reserve_address", timeout_s=t.start_s, phase="start")
        self.specs = self.strategy_specs(addresses)  # in bundle order: chief last
        tasks = group.of("task")
        served = group.call(
            tasks, "start", [(s,) for s in self.specs[:-1]], timeout_s=t.peers_s, phase="peers"
        )
        chief = group.call(
            group.of("chief"), "start", [(self.specs[-1],)], timeout_s=t.peers_s, phase="peers"
        )
        self.task_rows = [{**r, **s} for r, s in zip(ready[:-1], served)]
        self.watch = {m.actor.serve.remote(): m for m in tasks}
        # Workers: TensorFlow's worker tasks (their devices) and the chief that drives them.
        self.worker_rows = [r for r in self.task_rows if r["role"] == "worker"]
        chief_row = {**ready[-1], **chief[0], "role": "chief"}
        return [*self.worker_rows, chief_row], [r for r in self.task_rows if r["role"] == "ps"]

    def build(self, group: ActorGroup, job: Job, recovering: bool) -> Built:
        self.job = job
        return agree([self._chief(group, "build", job)], job, recovering)

    def seek(self, group: ActorGroup, position: int) -> None:
        """TensorFlow's workers hold the data: a resumed run starts their data afresh."""

    def train(self, group: ActorGroup, segment: Segment, timeout_s: float) -> list[dict]:
        """The chief's segment, watching every task: a dead worker task is started again in
        place while the chief goes on; a dead ps task ends the attempt."""
        (chief,) = group.of("chief")
        ref = chief.actor.run_epoch.remote(*segment.args())

        def restart(member: Member, error: BaseException) -> Any:
            return self._restart_task(group, member, error)

        done = group.wait(
            {ref: chief}, timeout_s=timeout_s, phase="epoch", on_lost=restart, watch=self.watch
        )
        return [done[chief]]

    def _restart_task(self, group: ActorGroup, member: Member, error: Any) -> Any:
        """Start worker task ``member`` again at its address; TensorFlow reconnects to it.
        The chief's death, or a ps task's (its variables are gone), ends the attempt."""
        if member.role != "task":
            raise error
        i = group.of("task").index(member)
        if self.specs[i].role == "ps":
            raise error
        t = self.timeouts
        # If its address cannot be had again (the node is gone, the port taken), the group
        # restarts with fresh addresses from the checkpoint.
        with self.hooks.replacing(error):
            group.replace(member)
            row = group.call([member], "ready", timeout_s=t.start_s, phase="start")[0]
            group.call([member], "start", [(self.specs[i],)], timeout_s=t.peers_s, phase="peers")
        spe = self.job.steps_per_execution
        # TensorFlow re-runs a closure the task was running: at most its K steps twice.
        self.hooks.replaced(row, AUTO_STEPS_PER_EXECUTION if spe == "auto" else int(spe), None)
        ref = member.actor.serve.remote()
        self.watch = {r: m for r, m in self.watch.items() if m is not member}
        self.watch[ref] = member
        return ref

    def save(self, group: ActorGroup, epoch: int, step: int) -> str | None:
        return self._chief(group, "save", epoch, step, phase="checkpoint")

    def end_epoch(
        self, group: ActorGroup, epoch: int, results: list[dict], logs: dict[str, float]
    ) -> EpochEnd:
        # The chief alone runs the callbacks; its learning rate is a variable on the ps tasks.
        return EpochEnd(results[0]["checkpoint"], logs, bool(results[0].get("stop_training")))

    def report(self, group: ActorGroup) -> Report:
        final = self._chief(group, "final", True, phase="final")
        placement = self._chief(group, "placement", phase="final")
        # The worker tasks only serve: the chief measured the run and holds the model.
        finals = [{} for _ in self.worker_rows] + [final]
        servers = []
        for row in self.task_rows:
            if row.get("role") != "ps":
                continue
            task = "/job:ps/replica:0/task:" + row["name"].split("-")[1] + "/"
            holds = sorted(p for p, d in placement.items() if task in d + "/")
            servers.append({**row, "holds": holds})
        return Report(finals=finals, servers=servers)

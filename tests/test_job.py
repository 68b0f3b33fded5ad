"""The cluster path end to end: `ray start --head` (fake GPUs), a raytf run as a Ray job."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Output:
    """Drains a process's output on a thread (a full pipe would block it) into a queue."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._proc = proc
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self._proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, needle: str, timeout: float) -> None:
        """Return once a line contains ``needle``; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(
                    f"no {needle!r} within {timeout}s:\n{''.join(self.seen)[-3000:]}"
                ) from None
            if line is None:
                raise RuntimeError(f"ray start exited:\n{''.join(self.seen)[-3000:]}")
            self.seen.append(line)
            if needle in line:
                return


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """A real Ray head with 2 declared (fake) GPUs, stopped with everything it started."""
    gcs, dashboard = _free_port(), _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [
            f"{BIN}/ray",
            "start",
            "--head",
            "--block",
            f"--port={gcs}",
            "--num-cpus=4",
            "--num-gpus=2",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            "--disable-usage-stats",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        _Output(proc).wait_for("Ray runtime started", timeout=120)
        yield f"http://127.0.0.1:{dashboard}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # --block: ray stops what it started
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_raytf_run_as_a_ray_job(head):
    from ray.job_submission import JobStatus, JobSubmissionClient

    # Ray 2.60 heads require the token they keep in ~/.ray/auth_token; send it explicitly.
    with open(os.path.expanduser("~/.ray/auth_token")) as f:
        token = f.read().strip()
    client = JobSubmissionClient(head, headers={"authorization": f"Bearer {token}"})
    job = client.submit_job(
        entrypoint=f"{BIN}/raytf run {ROOT}/experiments/digits.py --address auto",
        runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}},
    )

    async def follow() -> str:
        lines = []
        async for chunk in client.tail_job_logs(job):  # ends when the job ends
            lines.append(chunk)
        return "".join(lines)

    logs = asyncio.run(asyncio.wait_for(follow(), timeout=400))
    status = client.get_job_status(job)
    assert status == JobStatus.SUCCEEDED, logs[-3000:]
    # The head declares 2 GPUs on one node: auto picks in-graph on both, mirrored engine.
    assert "layout in-graph (mirrored): 1 actor x 2 GPU device(s)" in logs
    assert "raytf: targets met: test_accuracy >= 0.95" in logs

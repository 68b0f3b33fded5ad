"""The command line, run as a user runs it: a subprocess of the installed `raytf` script."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAYTF = os.path.join(os.path.dirname(sys.executable), "raytf")


def raytf(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RAYTF, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )


def test_plan_for_a_hypothetical_cluster_needs_no_ray():
    out = raytf("plan", "--nodes", "16:8,16:8", "--replicas", "16")
    assert out.returncode == 0, out.stderr
    assert "all-reduce (NCCL): 2 actor(s) x 8 GPU device(s)" in out.stdout
    assert "do not fit on one node" in out.stdout


def test_plan_refuses_what_can_never_fit():
    out = raytf("plan", "--nodes", "8:2", "--replicas", "8", "--use-gpu")
    assert out.returncode == 2
    assert "8 GPU replica(s) can never be placed" in out.stderr


def test_layouts_lists_the_registry():
    out = raytf("layouts")
    assert out.stdout.split() == [
        "auto",
        "all-reduce",
        "in-graph",
        "mirrored",
        "parameter-server",
        "towers",
    ]


def test_missing_experiment_file():
    out = raytf("run", "experiments/nope.py")
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_yaml_with_an_unknown_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"experiment: {ROOT}/experiments/digits.py\nconfig:\n  epoch: 3\n")
    out = raytf("run", str(bad))
    assert out.returncode == 2
    assert "Unknown key(s) ['epoch']" in out.stderr and "'epochs'" in out.stderr


def test_replicas_with_shaping_flags():
    out = raytf(
        "plan",
        "--nodes",
        "8:0",
        "--layout",
        "in-graph",
        "--strategy",
        "mirrored",
        "--replicas",
        "4",
    )
    assert out.returncode == 0, out.stderr
    assert "in-graph (mirrored): 1 actor x 4 logical CPU device(s)" in out.stdout
    out = raytf(
        "plan", "--nodes", "8:0,8:0", "--layout", "all-reduce", "--workers", "2", "--replicas", "4"
    )
    assert out.returncode == 2 and "replicas=4 disagrees" in out.stderr


def test_unreachable_cluster_fails_fast():
    with socket.socket() as s:  # a port with nobody behind it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = raytf("plan", "--address", f"127.0.0.1:{port}", timeout=60)
    assert out.returncode == 2 and "No Ray cluster answers at 127.0.0.1" in out.stderr
    doctor = raytf("doctor", "--address", f"127.0.0.1:{port}", timeout=60)
    assert doctor.returncode == 1
    assert "[FAIL] ray cluster" in doctor.stdout and "fix: start one" in doctor.stdout


@pytest.mark.slow
@pytest.mark.ray
def test_doctor_on_a_fresh_local_ray():
    out = raytf("doctor", timeout=200)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    for name in ("python", "tensorflow", "ray", "ray cluster", "gpus", "node-to-node tcp"):
        assert f"[  ok] {name} " in out.stdout
    assert "6/6 checks passed" in out.stdout


def test_shaping_flags_need_a_named_layout():
    out = raytf("plan", "--nodes", "4:0", "--workers", "2")
    assert out.returncode == 2 and "shape a named layout" in out.stderr


@pytest.mark.slow
@pytest.mark.ray
def test_run_yaml_experiment_all_reduce_and_miss_the_target(tmp_path):
    exp = tmp_path / "short.yaml"
    exp.write_text(
        f"experiment: {ROOT}/experiments/digits.py\n"
        "config: {epochs: 1, layout: all-reduce, workers: 2}\n"
        "targets: {test_accuracy: 0.999}\n"
    )
    out = raytf("run", str(exp), "--checkpoint-dir", str(tmp_path / "ck"))
    assert "all-reduce (RING): 2 actor(s)" in out.stdout, out.stderr[-2000:]
    assert "epoch 1/1" in out.stdout and "raytf: evaluation: test_accuracy" in out.stdout
    assert out.returncode == 1 and "target missed: test_accuracy" in out.stderr
    assert (tmp_path / "ck" / "model.keras").exists()


@pytest.mark.slow
@pytest.mark.ray
def test_sweep_yaml_writes_a_ranked_table_and_a_rerunnable_best(tmp_path):
    exp = tmp_path / "sweep.yaml"
    exp.write_text(
        f"experiment: {ROOT}/experiments/digits.py\n"
        "config: {epochs: 1, global_batch_size: 64}\n"
        "space: {layout: {grid_search: [towers, all-reduce]}, lr: 0.003}\n"
    )
    out = raytf("sweep", str(exp), "--storage", str(tmp_path), "--name", "s", "--quiet")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rank  configuration" in out.stdout and "layout=all-reduce, lr=0.003" in out.stdout
    best = tmp_path / "s" / "best.yaml"
    assert (tmp_path / "s" / "sweep.png").exists() and best.exists()
    rerun = raytf("run", str(best), "--quiet")
    assert "raytf: evaluation: test_accuracy" in rerun.stdout, rerun.stderr[-2000:]


def test_plan_picks_parameter_servers_when_they_pay():
    nodes = ",".join(["4:1"] * 4 + ["8:0"] * 4)
    out = raytf("plan", "--nodes", nodes)
    assert out.returncode == 0, out.stderr
    assert "parameter-server (sync, backend ray): 4 GPU worker(s) + 4 server(s)" in out.stdout
    out = raytf("plan", "--nodes", "4:1,4:1", "--stragglers")
    assert "parameter-server (sync, 1 backup, backend ray)" in out.stdout, out.stderr
    out = raytf(
        "plan", "--nodes", "8:0", "--layout", "parameter-server", "--workers", "2",
        "--staleness", "async", "--backend", "tensorflow",
    )  # fmt: skip
    assert (
        "parameter-server (async, backend tensorflow): 2 CPU worker(s) + 1 server(s)" in out.stdout
    )
    out = raytf("plan", "--nodes", "8:0", "--layout", "parameter-server", "--staleness", "often")
    assert out.returncode == 2 and "expected 0 (synchronous), a number of steps k" in out.stderr


@pytest.mark.slow
@pytest.mark.ray
def test_run_parameter_server_experiment(tmp_path):
    exp = tmp_path / "ps.yaml"
    exp.write_text(
        f"experiment: {ROOT}/experiments/digits.py\n"
        "config: {layout: parameter-server, workers: 2, ps: 1, staleness: async, epochs: 12,\n"
        "         cpus_per_worker: 0.5, cpus_per_ps: 0.5}\n"
        "targets: {test_accuracy: 0.85}\n"
    )
    out = raytf("run", str(exp))
    expected = "parameter-server (async, backend ray): 2 CPU worker(s) + 1 server(s)"
    assert expected in out.stdout, out.stderr[-2000:]
    assert "epoch 12/12" in out.stdout
    assert out.returncode == 0 and "targets met: test_accuracy" in out.stdout, out.stderr[-2000:]

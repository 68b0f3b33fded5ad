"""`raytf doctor`: the runbook as a command.

Each check says what it found and what was expected; a failure prints the error signature
users meet when it goes wrong, and the fix. Every check is bounded by a timeout.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from typing import TextIO

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    found: str
    expected: str
    signature: str = ""  # what the user sees when this goes wrong
    fix: str = ""


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_python() -> Check:
    found = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info >= (3, 10)
    return Check(
        "python",
        OK if ok else FAIL,
        found,
        ">= 3.10",
        "SyntaxError or 'requires a different Python' from pip",
        "use Python 3.10-3.12 on every node (the same minor version as the driver)",
    )


def check_tensorflow() -> Check:
    try:
        import keras
        import tensorflow as tf
    except Exception as exc:  # a missing or broken install
        return Check(
            "tensorflow",
            FAIL,
            f"import failed: {type(exc).__name__}: {exc}",
            "TensorFlow 2.21 with Keras 3",
            "ModuleNotFoundError: No module named 'tensorflow'",
            "pip install 'raytf[cpu]' (laptops, CPU nodes) or 'raytf[gpu]' (GPU nodes)",
        )
    found = f"tensorflow {tf.__version__}, keras {keras.__version__}"
    if not keras.__version__.startswith("3."):
        return Check(
            "tensorflow",
            FAIL,
            found,
            "Keras 3",
            "TF_USE_LEGACY_KERAS=1 or tf_keras resolving to Keras 2",
            "unset TF_USE_LEGACY_KERAS and uninstall tf_keras",
        )
    status = OK if tf.__version__.startswith("2.21.") else WARN
    return Check(
        "tensorflow",
        status,
        found,
        "2.21.x (the version raytf is tested with)",
        "other versions: untested",
        "pip install 'tensorflow>=2.21,<2.22'",
    )


def check_ray_version() -> Check:
    import ray

    v = _version_tuple(ray.__version__)
    ok = (2, 60) <= v[:2] < (3, 0)
    return Check(
        "ray",
        OK if ok else FAIL,
        ray.__version__,
        ">= 2.60, < 3",
        "Improper 'run' - not string nor trainable (Tune with Train V2), or API errors",
        "pip install 'ray[default,tune]==2.60.0' on every node",
    )


def check_cluster(address: str | None) -> Check:
    from raytf.api import connect, current_cluster

    where = address or "a new local Ray"
    try:
        connect(address)
        cluster = current_cluster()
    except Exception as exc:
        return Check(
            "ray cluster",
            FAIL,
            f"{where}: {type(exc).__name__}: {exc}",
            "a reachable Ray cluster",
            "ConnectionError: Could not find any running Ray instance",
            "start one (`ray start --head`, `ray up cluster.yaml`) or pass the right "
            "--address (on a cluster node: --address auto)",
        )
    return Check("ray cluster", OK, f"{where}: {cluster.describe()}", "a reachable Ray cluster")


def check_gpus() -> Check:
    """GPUs TensorFlow can use on this node versus GPUs Ray declares for it."""
    import ray
    import tensorflow as tf

    seen = len(tf.config.list_physical_devices("GPU"))
    node_id = ray.get_runtime_context().get_node_id()
    declared = 0
    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            declared = int(node.get("Resources", {}).get("GPU", 0))
    found = f"TensorFlow sees {seen} GPU(s); Ray declares {declared} on this node"
    if seen == declared:
        return Check("gpus", OK, found, "the same number")
    if declared > seen:
        return Check(
            "gpus",
            FAIL if seen == 0 else WARN,
            found,
            "the same number",
            "training runs on CPU although Ray gave the actor GPUs (CPU-only "
            "TensorFlow, or 'Could not load dynamic library libcudart')",
            "pip install 'raytf[gpu]' (tensorflow[and-cuda]) and check nvidia-smi; "
            "for test clusters with fake GPUs this is expected",
        )
    return Check(
        "gpus",
        WARN,
        found,
        "the same number",
        "GPUs idle: Ray does not offer them",
        "ray start --num-gpus=N (the cluster launcher detects them itself)",
    )


class _Probe:
    """A tiny actor: listens on an ephemeral port, or connects to one."""

    def listen(self) -> tuple[str, int]:
        import ray

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("", 0))
        self.sock.listen(1)
        return ray.util.get_node_ip_address(), self.sock.getsockname()[1]

    def accept(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        conn, _ = self.sock.accept()
        conn.sendall(b"raytf")
        conn.close()
        return True

    def connect(self, host: str, port: int, timeout: float) -> str:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(5).decode()


def check_tcp(timeout: float = 15.0) -> Check:
    """Two actors on different nodes open a TCP connection on an ephemeral port."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    pair = nodes[:2] if len(nodes) > 1 else nodes * 2
    scope = "between two nodes" if len(nodes) > 1 else "on the only node"
    probe = ray.remote(num_cpus=0)(_Probe)
    actors = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
        for n in pair
    ]
    try:
        ready, _ = ray.wait([actors[0].listen.remote()], timeout=timeout)
        if not ready:
            raise TimeoutError(f"the listening actor did not start within {timeout:g}s")
        host, port = ray.get(ready[0])
        accepted = actors[0].accept.remote(timeout)
        got = actors[1].connect.remote(host, port, timeout)
        done, _ = ray.wait([got, accepted], num_returns=2, timeout=timeout + 5)
        if len(done) < 2:
            raise TimeoutError(f"no connection to {host}:{port} within {timeout:g}s")
        if ray.get(got) != "raytf":
            raise ConnectionError("the connection carried no data")
        ray.get(accepted)
    except Exception as exc:
        return Check(
            "node-to-node tcp",
            FAIL,
            f"{scope}: {type(exc).__name__}: {exc}",
            "a connection on an ephemeral port",
            "MultiWorkerMirroredStrategy blocks for minutes, then raytf reports "
            '"TensorFlow peers did not connect"',
            "allow all TCP between the cluster's nodes (security group / firewall)",
        )
    finally:
        for actor in actors:
            ray.kill(actor)
    return Check(
        "node-to-node tcp",
        OK,
        f"{scope}: connected to {host}:{port}",
        "a connection on an ephemeral port",
    )


def run_doctor(address: str | None, out: TextIO = sys.stdout, timeout: float = 60.0) -> int:
    """Run every check; print them; return 0 when none failed."""
    # Each check bounds its own waits (ray.wait, socket timeouts): ray.init must run on the
    # main thread, so checks are not wrapped in threads.
    checks = [check_python(), check_tensorflow(), check_ray_version()]
    cluster = check_cluster(address)
    checks.append(cluster)
    if cluster.status == OK:
        checks.append(check_gpus())
        checks.append(check_tcp(timeout))
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"[{c.status:>4}] {c.name.ljust(width)}  {c.found}", file=out)
        print(f"       {' ' * width}  expected: {c.expected}", file=out)
        if c.status != OK and c.fix:
            print(f"       {' ' * width}  signature: {c.signature}", file=out)
            print(f"       {' ' * width}  fix: {c.fix}", file=out)
    failed = [c.name for c in checks if c.status == FAIL]
    print(
        f"raytf doctor: {len(checks) - len(failed)}/{len(checks)} checks passed"
        + (f"; failed: {', '.join(failed)}" if failed else ""),
        file=out,
    )
    return 1 if failed else 0

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


class _GpuProbe:
    """Counts the GPUs TensorFlow can use on its node (Ray's CUDA masking is switched off)."""

    def count(self) -> int | str:
        try:
            import tensorflow as tf
        except Exception as exc:  # reported, not raised: one bad node must not hide the rest
            return f"TensorFlow import failed: {type(exc).__name__}: {exc}"
        return len(tf.config.list_physical_devices("GPU"))


def check_gpus(timeout: float = 60.0) -> Check:
    """On every node: GPUs TensorFlow can use versus GPUs Ray declares."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    probe = ray.remote(num_cpus=0)(_GpuProbe)
    env = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    actors = [
        probe.options(
            runtime_env={"env_vars": env},
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote()
        for n in nodes
    ]
    try:
        refs = [a.count.remote() for a in actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        answers = {ref: ray.get(ref) for ref in ready}
    finally:
        for actor in actors:
            ray.kill(actor)
    problems, worst = [], OK
    for node, ref in zip(nodes, refs, strict=True):
        where = node.get("NodeManagerAddress", node["NodeID"][:8])
        declared = int(node.get("Resources", {}).get("GPU", 0))
        seen = answers.get(ref, f"no answer within {timeout:g}s")
        if isinstance(seen, str):
            problems.append(f"{where}: {seen}")
            worst = FAIL
        elif seen != declared:
            problems.append(f"{where}: TensorFlow sees {seen}, Ray declares {declared}")
            if declared > seen == 0:
                worst = FAIL
            elif worst == OK:
                worst = WARN
    total = sum(int(n.get("Resources", {}).get("GPU", 0)) for n in nodes)
    found = "; ".join(problems) or (
        f"{len(nodes)} node(s): TensorFlow sees the {total} GPU(s) Ray declares"
    )
    return Check(
        "gpus",
        worst,
        found,
        "on every node, the GPUs Ray declares are the GPUs TensorFlow sees",
        "training runs on CPU although Ray gave the actor GPUs (CPU-only TensorFlow, or "
        "'Could not load dynamic library libcudart'); or GPUs idle because Ray does not offer "
        "them",
        "pip install 'raytf[gpu]' (tensorflow[and-cuda]) and check nvidia-smi on that node; "
        "`ray start --num-gpus=N` if Ray under-declares; fake GPUs on test clusters are expected",
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


def check_tcp(timeout: float = 15.0, remote: bool = False) -> Check:
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
    # One node of a remote cluster proves nothing about the links between its nodes.
    status = WARN if remote and len(nodes) < 2 else OK
    return Check(
        "node-to-node tcp",
        status,
        f"{scope}: connected to {host}:{port}",
        "a connection on an ephemeral port between two nodes",
        "only one node is up, so the links between nodes were not checked",
        "run doctor again once the worker nodes are up",
    )


def run_doctor(address: str | None, out: TextIO = sys.stdout, timeout: float = 60.0) -> int:
    """Run every check; print them; return 0 when none failed."""
    # Each check bounds its own waits (ray.wait, socket timeouts): ray.init must run on the
    # main thread, so checks are not wrapped in threads.
    checks = [check_python(), check_tensorflow(), check_ray_version()]
    cluster = check_cluster(address)
    checks.append(cluster)
    if cluster.status == OK:
        checks.append(check_gpus(timeout))
        checks.append(check_tcp(timeout, remote=address is not None))
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

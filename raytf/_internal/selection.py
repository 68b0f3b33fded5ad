"""The auto-selection rule: one pure function from (request, cluster) to a layout choice.

No Ray and no TensorFlow here, so the rule is tested with a table and can be printed by
`raytf plan` for a cluster that does not exist yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raytf._internal.checks import positive_int
from raytf._internal.cluster import ClusterInfo, bundles_fit
from raytf.errors import PlacementError

# On CPU, logical devices share the same cores: more of them add no compute, only show the
# replica machinery. Two is the default on a one-node CPU cluster.
DEFAULT_CPU_REPLICAS = 2
#: With stragglers=True: one backup worker per this many workers (at least one). Measured
#: against a persistent straggler: 1.45x all-reduce, where bounded staleness gained nothing.
WORKERS_PER_BACKUP = 4


@dataclass(frozen=True)
class Choice:
    """What the rule decided: a registered layout name, its options and the reasons."""

    layout: str
    options: dict[str, Any] = field(default_factory=dict)
    explanation: str = ""


def _largest_fitting_split(
    replicas: int, per_device: str, cluster: ClusterInfo, cpus_per_worker: float
) -> int | None:
    """Largest devices-per-worker d dividing ``replicas`` whose workers all fit; None if none."""
    for d in sorted((d for d in range(1, replicas + 1) if replicas % d == 0), reverse=True):
        workers = replicas // d
        if per_device == "GPU":
            bundle = {"CPU": cpus_per_worker, "GPU": d}
        else:
            bundle = {"CPU": float(d)}
        if bundles_fit([bundle] * workers, cluster):
            return d
    return None


def default_replicas(cluster: ClusterInfo, use_gpu: bool) -> tuple[int, str]:
    """How many replicas to run when the user does not say, and why."""
    if use_gpu:
        n = int(cluster.total_gpus)
        return n, f"default: every GPU of the cluster, {n}"
    n = min(DEFAULT_CPU_REPLICAS, max(1, int(cluster.max_cpus_per_node)))
    return n, f"default without GPUs: {n} CPU replicas; pass replicas= for more"


def resolve_use_gpu(cluster: ClusterInfo, use_gpu: bool | None) -> bool:
    """``None`` means GPUs if the cluster has any; ``True`` on a GPU-less cluster is refused."""
    if use_gpu is None:
        return cluster.total_gpus > 0
    if use_gpu and cluster.total_gpus == 0:
        raise PlacementError(
            f"use_gpu=True but the cluster has no GPUs ({cluster.describe()}). "
            "Add GPU nodes, or pass use_gpu=False to train on CPUs."
        )
    return use_gpu


def allreduce_cost(worker_nodes: int) -> float:
    """Ring all-reduce time per step in units of S/B (model bytes over one node's bandwidth)."""
    return 2 * (worker_nodes - 1) / worker_nodes if worker_nodes > 1 else 0.0


def ps_cost(workers: int, workers_per_node: int, servers: int) -> float:
    """Parameter-server time per step in units of S/B: a worker node sends and receives S per
    worker it hosts; each of ``servers`` server nodes handles workers/servers of the traffic."""
    return max(float(workers_per_node), workers / servers)


def _spare_cpu_nodes(cluster: ClusterInfo) -> int:
    return sum(1 for n in cluster.nodes if n.gpus == 0 and n.cpus >= 1)


def _ps_choice(
    cluster: ClusterInfo, workers: int, use_gpu: bool, staleness: int | None, backend: str
) -> tuple[dict[str, Any], int] | None:
    """Parameter-server options for ``workers`` workers, servers on spare CPU-only nodes when
    there are any (one per node), else one per worker node; None if they cannot be placed."""
    spare = _spare_cpu_nodes(cluster)
    worker_nodes = sum(1 for n in cluster.nodes if (n.gpus if use_gpu else n.cpus) >= 1)
    servers = spare or max(1, min(workers, worker_nodes))
    options = {"workers": workers, "ps": servers, "staleness": staleness, "use_gpu": use_gpu}
    if backend != "auto":
        options["backend"] = backend
    worker = {"CPU": 1.0, "GPU": 1.0} if use_gpu else {"CPU": 1.0}
    if not bundles_fit([worker] * workers + [{"CPU": 1.0}] * servers, cluster):
        return None
    return options, servers


def choose_layout(
    cluster: ClusterInfo,
    replicas: int | None = None,
    use_gpu: bool | None = None,
    cpus_per_worker: float = 1,
    stragglers: bool = False,
    preemptible: bool = False,
) -> Choice:
    """Pick in-graph when the replicas fit on one node; across nodes, all-reduce, unless a
    parameter server is the better choice:

    - ``preemptible=True`` (workers may vanish, e.g. spot instances): asynchronous parameter
      servers on TensorFlow's backend, which moves a lost worker's steps to the others;
    - ``stragglers=True`` (some workers are slower: shared or mixed machines): synchronous
      steps with backup workers, so a step does not wait for the slowest;
    - GPU workers one per node with spare CPU-only nodes to host servers, when the
      communication model says the servers move the bytes faster (docs/communication.md).

    ``use_gpu=None`` means: GPUs if the cluster has any. ``replicas=None`` means: every GPU of
    the cluster, or two CPU replicas on a cluster without GPUs.
    """
    if not cluster.nodes:
        raise PlacementError("The Ray cluster has no alive nodes; start Ray or check the address.")
    positive_int("replicas", replicas, "It counts devices.", allow_none=True)

    gpus_total = int(cluster.total_gpus)
    use_gpu = resolve_use_gpu(cluster, use_gpu)
    device = "GPU" if use_gpu else "CPU"
    facts = (
        f"cluster: {cluster.describe()}; largest node: "
        f"{cluster.max_cpus_per_node:g} CPU, {cluster.max_gpus_per_node:g} GPU"
    )

    defaulted = ""
    if replicas is None:
        replicas, why = default_replicas(cluster, use_gpu)
        defaulted = f" ({why})"

    per_node = cluster.max_gpus_per_node if use_gpu else cluster.max_cpus_per_node
    one_node_bundle = (
        {"CPU": cpus_per_worker, "GPU": replicas} if use_gpu else {"CPU": float(replicas)}
    )
    if replicas <= per_node and bundles_fit([one_node_bundle], cluster):
        strategy = "mirrored" if use_gpu else "towers"
        why_strategy = (
            "strategy 'mirrored' (MirroredStrategy with NCCL all-reduce between the GPUs)"
            if use_gpu
            else "strategy 'towers' (one tower per logical CPU device in one tf.function; "
            "measured 1.45-1.8x MirroredStrategy's throughput on a CPU MLP, a tie on a small "
            "CNN: docs/benchmarks.md)"
        )
        return Choice(
            layout="in-graph",
            options={"devices": replicas, "strategy": strategy, "use_gpu": use_gpu},
            explanation=(
                f"in-graph: {replicas} {device} replica(s){defaulted} fit on one node "
                f"({per_node:g} {device}s there), so one actor drives them all in one graph "
                f"with no network hop; {why_strategy}. [{facts}]"
            ),
        )

    d = _largest_fitting_split(replicas, device, cluster, cpus_per_worker)
    if device == "CPU":
        # MultiWorkerMirroredStrategy drives one CPU device per worker.
        d = 1 if bundles_fit([{"CPU": 1.0}] * replicas, cluster) else None
    if d is None:
        have = gpus_total if use_gpu else int(cluster.total_cpus)
        raise PlacementError(
            f"{replicas} {device} replica(s){defaulted} can never be placed: the cluster has "
            f"{have} {device}(s) in all [{facts}]. Ask for at most {have} replicas, "
            "or add nodes (an autoscaling cluster counts only the nodes that are up: raise "
            "min_workers or call ray.autoscaler.sdk.request_resources first)."
        )
    workers = replicas // d
    hint = ""
    if preemptible or stragglers:
        mode = (None, "tensorflow") if preemptible else (0, "auto")
        ps = _ps_choice(cluster, replicas, use_gpu, *mode)
        if ps is not None:
            options, servers = ps
            backups = max(1, replicas // WORKERS_PER_BACKUP)
            if not preemptible:
                options["backup_workers"] = backups
            why = (
                "workers may be preempted (preemptible=True), so asynchronous parameter "
                "servers on TensorFlow's backend: a lost worker's steps move to the others "
                "and nobody waits for it"
                if preemptible
                else f"some workers are slower (stragglers=True), so synchronous steps with "
                f"{backups} backup worker(s): each step closes on the first "
                f"{replicas - backups} gradient(s) instead of waiting for the slowest, as "
                "all-reduce would, and the epoch ends when its steps are done"
            )
            return Choice(
                layout="parameter-server",
                options=options,
                explanation=(
                    f"parameter-server: {replicas} {device} replica(s){defaulted} span nodes "
                    f"and {why}; {replicas} worker(s) and {servers} server(s). [{facts}]"
                ),
            )
        hint = " (the parameter servers the hint asks for do not fit; all-reduce instead)"
    elif use_gpu and _spare_cpu_nodes(cluster):
        per_node = max(1, min(int(cluster.max_gpus_per_node), replicas))
        ps = _ps_choice(cluster, replicas, use_gpu, 0, "auto")
        ar = allreduce_cost(workers)
        if ps is not None:
            options, servers = ps
            cost = ps_cost(replicas, per_node, servers)
            if cost < ar:
                return Choice(
                    layout="parameter-server",
                    options=options,
                    explanation=(
                        f"parameter-server (synchronous): {replicas} GPU replica(s){defaulted} "
                        f"span nodes and {servers} CPU-only node(s) can host servers; per step "
                        f"servers move max(workers per node, workers/servers) = {cost:.2f} x "
                        f"S/B against all-reduce's 2(n-1)/n = {ar:.2f} x S/B (model bytes S, "
                        f"bandwidth B), with the same synchronous updates. [{facts}]"
                    ),
                )
            hint = (
                f"; parameter servers on the {servers} CPU-only node(s) would cost {cost:.2f} "
                f"x S/B per step against {ar:.2f}"
            )
    return Choice(
        layout="all-reduce",
        options={"workers": workers, "devices": d, "use_gpu": use_gpu},
        explanation=(
            f"all-reduce: {replicas} {device} replica(s){defaulted} do not fit on one node "
            f"(at most {per_node:g} {device}s per node), so {workers} worker actor(s) with "
            f"{d} {device}(s) each run MultiWorkerMirroredStrategy and sync gradients with "
            f"{'NCCL' if use_gpu else 'RING'} collectives{hint}. [{facts}]"
        ),
    )

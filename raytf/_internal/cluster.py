"""A snapshot of the Ray cluster's nodes, and bin-packing of resource bundles onto them.

Pure data and pure functions: the auto rule and the placement check are tested without Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    node_id: str
    address: str
    cpus: float
    gpus: float


@dataclass(frozen=True)
class ClusterInfo:
    nodes: tuple[Node, ...]

    @property
    def total_gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    @property
    def total_cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def max_gpus_per_node(self) -> float:
        return max((n.gpus for n in self.nodes), default=0)

    @property
    def max_cpus_per_node(self) -> float:
        return max((n.cpus for n in self.nodes), default=0)

    def describe(self) -> str:
        counts = ", ".join(f"{n.cpus:g} CPU/{n.gpus:g} GPU" for n in self.nodes)
        return f"{len(self.nodes)} node(s) [{counts}]"

    @classmethod
    def from_counts(cls, *nodes: tuple[float, float]) -> ClusterInfo:
        """Build a snapshot from (cpus, gpus) pairs; handy for tests and `raytf plan --nodes`."""
        return cls(
            tuple(Node(f"node{i}", f"10.0.0.{i + 1}", c, g) for i, (c, g) in enumerate(nodes))
        )


def cluster_from_ray_nodes(ray_nodes: Iterable[Mapping]) -> ClusterInfo:
    """Turn ``ray.nodes()`` into a snapshot of the alive nodes' total resources."""
    nodes = []
    for raw in ray_nodes:
        if not raw.get("Alive", False):
            continue
        res = raw.get("Resources", {})
        nodes.append(
            Node(
                node_id=raw.get("NodeID", ""),
                address=raw.get("NodeManagerAddress", ""),
                cpus=float(res.get("CPU", 0)),
                gpus=float(res.get("GPU", 0)),
            )
        )
    return ClusterInfo(tuple(nodes))


def bundles_fit(bundles: Sequence[Mapping[str, float]], cluster: ClusterInfo) -> bool:
    """Whether the bundles can ever be placed on the cluster's nodes (first-fit decreasing).

    First-fit decreasing can miss a packing that exists in rare cases; for the handful of equal
    bundles a layout asks for it is exact.
    """
    free = [{"CPU": n.cpus, "GPU": n.gpus} for n in cluster.nodes]
    order = sorted(bundles, key=lambda b: (b.get("GPU", 0), b.get("CPU", 0)), reverse=True)
    for bundle in order:
        for node in free:
            if all(node.get(k, 0) >= v for k, v in bundle.items()):
                for k, v in bundle.items():
                    node[k] = node.get(k, 0) - v
                break
        else:
            return False
    return True

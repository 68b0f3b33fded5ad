"""The auto rule, table-driven: no Ray, no TensorFlow."""

from __future__ import annotations

import pytest

import raytf
from raytf._internal.cluster import ClusterInfo, bundles_fit
from raytf._internal.selection import choose_layout
from raytf.errors import ConfigError, PlacementError

C = ClusterInfo.from_counts

# cluster, replicas, use_gpu -> layout, options
TABLE = [
    # one CPU node: logical devices in one graph, towers strategy
    (C((2, 0)), None, None, "in-graph", {"devices": 2, "strategy": "towers", "use_gpu": False}),
    (C((8, 0)), 4, None, "in-graph", {"devices": 4, "strategy": "towers", "use_gpu": False}),
    (C((1, 0)), None, None, "in-graph", {"devices": 1, "strategy": "towers", "use_gpu": False}),
    # CPU replicas that do not fit one node: one CPU worker each
    (C((2, 0)), 3, None, None, None),  # 3 CPUs asked, 2 in all: refused below
    (C((2, 0), (2, 0)), 4, None, "all-reduce", {"workers": 4, "devices": 1, "use_gpu": False}),
    (
        C((4, 0), (4, 0)),
        None,
        None,
        "in-graph",
        {"devices": 2, "strategy": "towers", "use_gpu": False},
    ),  # default: 2 CPU replicas
    # one GPU node holds every GPU: in-graph, mirrored strategy
    (C((8, 4)), None, None, "in-graph", {"devices": 4, "strategy": "mirrored", "use_gpu": True}),
    (
        C((8, 4), (8, 4)),
        4,
        None,
        "in-graph",
        {"devices": 4, "strategy": "mirrored", "use_gpu": True},
    ),
    # GPUs spread over nodes: all-reduce, as many devices per worker as fit
    (C((8, 4), (8, 4)), None, None, "all-reduce", {"workers": 2, "devices": 4, "use_gpu": True}),
    (C((4, 1), (4, 1)), None, None, "all-reduce", {"workers": 2, "devices": 1, "use_gpu": True}),
    (C((8, 4), (8, 2)), 6, None, "all-reduce", {"workers": 3, "devices": 2, "use_gpu": True}),
    (
        C((2, 0), (4, 2), (4, 2)),
        None,
        None,
        "all-reduce",
        {"workers": 2, "devices": 2, "use_gpu": True},
    ),
    # use_gpu=False on a GPU cluster trains on CPUs
    (C((4, 2)), 2, False, "in-graph", {"devices": 2, "strategy": "towers", "use_gpu": False}),
]


# cluster, replicas, hints -> layout, options: when parameter servers beat all-reduce
PS_TABLE = [
    # one GPU per node and 4 spare CPU nodes: servers move S/B per step, all-reduce 1.5 S/B
    (
        C(*[(4, 1)] * 4, *[(8, 0)] * 4),
        None,
        {},
        "parameter-server",
        {"workers": 4, "ps": 4, "staleness": 0, "use_gpu": True},
    ),
    # one spare CPU node for 4 workers: the server is the bottleneck (4 S/B): all-reduce
    (
        C(*[(4, 1)] * 4, (8, 0)),
        None,
        {},
        "all-reduce",
        {"workers": 4, "devices": 1, "use_gpu": True},
    ),
    # 4 GPUs per node: each node would push 4 copies; all-reduce stays
    (
        C((8, 4), (8, 4), *[(8, 0)] * 4),
        None,
        {},
        "all-reduce",
        {"workers": 2, "devices": 4, "use_gpu": True},
    ),
    # stragglers across nodes: backup workers, servers one per worker node without CPU nodes
    (
        C((4, 1), (4, 1)),
        None,
        {"stragglers": True},
        "parameter-server",
        {"workers": 2, "ps": 2, "staleness": 0, "use_gpu": True, "backup_workers": 1},
    ),
    (
        C((2, 0), (2, 0)),
        4,
        {"stragglers": True},
        "all-reduce",  # 4 CPU workers fill both nodes: no CPU left for a server
        {"workers": 4, "devices": 1, "use_gpu": False},
    ),
    (
        C((3, 0), (3, 0)),
        4,
        {"stragglers": True},
        "parameter-server",
        {"workers": 4, "ps": 2, "staleness": 0, "use_gpu": False, "backup_workers": 1},
    ),
    # preemptible workers: asynchronous, TensorFlow's engine reschedules a lost worker's steps
    (
        C((4, 1), (4, 1), (4, 0)),
        None,
        {"preemptible": True},
        "parameter-server",
        {"workers": 2, "ps": 1, "staleness": None, "backend": "tensorflow", "use_gpu": True},
    ),
    # every replica fits one node: one process has no stragglers; in-graph whatever the hints
    (
        C((8, 4)),
        None,
        {"stragglers": True, "preemptible": True},
        "in-graph",
        {"devices": 4, "strategy": "mirrored", "use_gpu": True},
    ),
]


@pytest.mark.parametrize(("cluster", "replicas", "hints", "layout", "options"), PS_TABLE)
def test_parameter_server_rule(cluster, replicas, hints, layout, options):
    choice = choose_layout(cluster, replicas, **hints)
    assert (choice.layout, choice.options) == (layout, options)
    if layout == "parameter-server":
        raytf.ParameterServer(**choice.options)  # the options make a valid layout


def test_parameter_server_explanations_give_the_costs_and_the_reason():
    text = choose_layout(C(*[(4, 1)] * 4, *[(8, 0)] * 4)).explanation
    assert "1.00 x S/B" in text and "1.50 x S/B" in text and "4 CPU-only node(s)" in text
    text = choose_layout(C(*[(4, 1)] * 4, (8, 0))).explanation
    assert "would cost 4.00 x S/B per step against 1.50" in text
    assert "stragglers=True" in choose_layout(C((4, 1), (4, 1)), stragglers=True).explanation
    text = choose_layout(C((2, 0), (2, 0)), 4, stragglers=True).explanation
    assert "do not fit; all-reduce instead" in text


@pytest.mark.parametrize(("cluster", "replicas", "use_gpu", "layout", "options"), TABLE)
def test_rule(cluster, replicas, use_gpu, layout, options):
    if layout is None:
        with pytest.raises(PlacementError, match="can never be placed"):
            choose_layout(cluster, replicas, use_gpu)
        return
    choice = choose_layout(cluster, replicas, use_gpu)
    assert (choice.layout, choice.options) == (layout, options)


def test_explanation_names_the_numbers():
    choice = choose_layout(C((8, 4), (8, 4)), 8)
    text = choice.explanation
    assert "all-reduce" in text and "8 GPU replica(s)" in text
    assert "at most 4 GPUs per node" in text and "2 node(s)" in text and "NCCL" in text


def test_asks_for_8_gpus_on_a_cluster_with_2():
    with pytest.raises(PlacementError, match=r"8 GPU replica\(s\) can never be placed.*2 GPU"):
        choose_layout(C((4, 1), (4, 1)), 8)


def test_use_gpu_without_gpus_is_refused():
    with pytest.raises(PlacementError, match="use_gpu=True but the cluster has no GPUs"):
        choose_layout(C((4, 0)), 2, use_gpu=True)


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_replicas(bad):
    with pytest.raises(ConfigError, match="replicas must be a positive integer"):
        choose_layout(C((4, 0)), bad)


def test_empty_cluster():
    with pytest.raises(PlacementError, match="no alive nodes"):
        choose_layout(ClusterInfo(()), 1)


@pytest.mark.parametrize(
    ("bundles", "nodes", "fits"),
    [
        ([{"CPU": 1, "GPU": 2}], [(4, 2)], True),
        ([{"CPU": 1, "GPU": 2}], [(4, 1), (4, 1)], False),
        ([{"CPU": 1, "GPU": 1}] * 2, [(4, 1), (4, 1)], True),
        ([{"CPU": 3}] * 2, [(4, 0), (2, 0)], False),
        ([{"CPU": 2}, {"CPU": 4}], [(4, 0), (2, 0)], True),
    ],
)
def test_bundles_fit(bundles, nodes, fits):
    assert bundles_fit(bundles, C(*nodes)) is fits

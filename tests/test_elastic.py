"""Elastic all-reduce on a real two-node Ray cluster: a node goes away and comes back.

Each node has room for one worker. When the second node is removed (its raylet and the worker
on it stop), no replacement can be had, so the run goes on with one worker from the newest
checkpoint; when a node is added again, the run grows back to two at the next boundary.
"""

from __future__ import annotations

import pytest
import workloads
from conftest import alive_actors

import raytf

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BATCH, EPOCHS = 32, 3
STEPS = workloads.EXAMPLES // BATCH


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING")
    yield c
    ray.shutdown()
    c.shutdown()


class _NodeLifecycle(raytf.Callback):
    """Remove the non-head node after the first epoch; add one after the second."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.nodes_per_epoch = []

    def on_epoch_end(self, epoch, logs):
        if epoch == 0:
            (node,) = self.cluster.worker_nodes
            self.cluster.remove_node(node)  # stops its raylet and the worker actor on it
        elif epoch == 1:
            self.cluster.add_node(num_cpus=1)
            self.cluster.wait_for_nodes()


def fit(callbacks, policy, tmp_path):
    return raytf.fit(
        workloads.mlp,
        workloads.data,
        global_batch_size=BATCH,
        epochs=EPOCHS,
        layout=raytf.AllReduce(workers=2),
        failures=policy,
        checkpoint_dir=str(tmp_path / "ckpt"),  # every "node" here shares this disk
        callbacks=callbacks,
        verbose=False,
    )


def test_all_reduce_shrinks_when_a_node_is_lost_and_grows_back(cluster, tmp_path):
    policy = raytf.FailurePolicy(max_failures=1, min_workers=1, replace_within_s=3)
    result = fit([_NodeLifecycle(cluster)], policy, tmp_path)
    (failure,) = result.failures
    assert failure.action == "restarted the group" and failure.restored_epoch == 1
    shrink, grow = result.resizes
    assert (shrink.from_workers, shrink.to_workers) == (2, 1)
    assert shrink.reason == "replacements unavailable"
    assert (grow.from_workers, grow.to_workers) == (1, 2)
    assert grow.reason == "resources returned" and grow.position == 2 * STEPS
    # The global batch stayed 32, so every epoch had its 16 steps. The death was noticed in
    # the next epoch's first segment, which counts as redone at most (an upper bound).
    assert shrink.global_batch_size == grow.global_batch_size == BATCH
    assert result.global_step == EPOCHS * STEPS and result.steps_redone <= STEPS
    assert result.steps_trained == EPOCHS * STEPS + result.steps_redone
    assert len(result.history["loss"]) == EPOCHS
    assert result.history["loss"][-1] < result.history["loss"][0]
    assert result.layout == raytf.AllReduce(workers=2) and len(result.workers) == 2
    assert len({w.node_id for w in result.workers}) == 2
    assert alive_actors() == []


def test_elastic_policies_are_checked_before_anything_starts(cluster, tmp_path):
    with pytest.raises(raytf.ConfigError, match=r"cannot change its worker count"):
        raytf.fit(
            workloads.mlp,
            workloads.data,
            global_batch_size=BATCH,
            layout=raytf.InGraph(devices=1),
            failures=raytf.FailurePolicy(max_failures=1, min_workers=1),
        )
    with pytest.raises(raytf.ConfigError, match=r"between 1 and 2"):
        fit([], raytf.FailurePolicy(max_failures=1, min_workers=3), tmp_path)
    with pytest.raises(raytf.ConfigError, match=r"max_failures=0 allows none"):
        raytf.FailurePolicy(min_workers=1)
    with pytest.raises(raytf.ConfigError, match=r"elastic_batch must be one of"):
        raytf.FailurePolicy(max_failures=1, min_workers=1, elastic_batch="local")

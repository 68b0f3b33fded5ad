"""Auto selection and placement on a simulated multi-node cluster with declared (fake) GPUs.

Nodes: a CPU-only head, two workers with 1 GPU each and one with 2 GPUs. TensorFlow here is
CPU-only, so actors train on logical CPU devices standing in for the GPUs Ray gave them.
"""

from __future__ import annotations

import pytest
import workloads

import raytf

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    one_gpu = [c.add_node(num_cpus=2, num_gpus=1) for _ in range(2)]
    two_gpu = c.add_node(num_cpus=2, num_gpus=2)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING")
    yield {"one_gpu": {n.node_id for n in one_gpu}, "two_gpu": two_gpu.node_id}
    ray.shutdown()
    c.shutdown()


def test_plan_spans_nodes_when_gpus_do_not_fit_one(cluster):
    plan = raytf.plan()  # default: every GPU, 4, but no node has 4
    # Workers need equal device counts: 2+2 would need two 2-GPU nodes, so 4 workers x 1.
    assert plan.layout == raytf.AllReduce(workers=4, devices=1, use_gpu=True)
    assert "4 GPU replica(s)" in plan.explanation and "4 node(s)" in plan.explanation


def test_impossible_request_is_refused_at_once(cluster):
    with pytest.raises(raytf.PlacementError, match=r"8 GPU replica\(s\) can never be placed"):
        raytf.plan(replicas=8)


def test_in_graph_actor_lands_on_the_node_with_both_gpus(cluster):
    result = raytf.fit(
        workloads.mlp,
        workloads.data,
        global_batch_size=64,
        epochs=1,
        replicas=2,
        verbose=False,
    )
    assert result.layout == raytf.InGraph(devices=2, strategy="mirrored", use_gpu=True)
    (worker,) = result.workers
    assert worker.node_id == cluster["two_gpu"]
    assert sorted(worker.gpu_ids) == ["0", "1"]
    assert worker.cuda_visible_devices in ("0,1", "1,0")
    assert len(worker.devices) == 2 and "stand-in" in worker.device_kind


def test_all_reduce_workers_spread_over_the_one_gpu_nodes(cluster):
    layout = raytf.AllReduce(workers=2, devices=1, use_gpu=True)
    # Hold the 2-GPU node so the two workers must take the 1-GPU nodes.
    import ray

    hog = ray.remote(num_gpus=2)(type("Hog", (), {"ping": lambda self: 1})).remote()
    ray.get(hog.ping.remote())
    try:
        result = raytf.fit(
            workloads.mlp,
            workloads.data,
            global_batch_size=64,
            epochs=2,
            layout=layout,
            verbose=False,
        )
    finally:
        ray.kill(hog)
    nodes = {w.node_id for w in result.workers}
    assert nodes == cluster["one_gpu"]  # one worker on each 1-GPU node
    # The cluster spec each worker received names the address that worker bound on its node.
    for w in result.workers:
        host, port = w.address.rsplit(":", 1)
        assert host == w.node_ip and int(port) > 0
    assert len({w.address for w in result.workers}) == 2
    assert all(len(w.gpu_ids) == 1 for w in result.workers)
    assert len({w.fingerprint for w in result.workers}) == 1
    assert result.history["loss"][-1] < result.history["loss"][0]


def test_doctor_checks_every_node(cluster):
    import io

    from raytf._internal.doctor import run_doctor

    out = io.StringIO()
    code = run_doctor(None, out=out, timeout=120)  # joins the running test cluster
    text = out.getvalue()
    # Fake GPUs: Ray declares them, TensorFlow (CPU build) sees none, on each GPU node.
    assert code == 1 and "[FAIL] gpus" in text
    assert text.count("TensorFlow sees 0, Ray declares") == 3
    assert "fix: pip install 'raytf[gpu]'" in text
    assert "[  ok] node-to-node tcp  between two nodes: connected to" in text


def test_each_actor_sees_its_own_gpus_and_cpu_actors_see_none(cluster):
    """Ray 2.60 leaves CUDA_VISIBLE_DEVICES unset for actors without GPUs, so TensorFlow in
    them would take every GPU of their node: raytf hides them. Servers needing 2 CPUs cannot
    sit on the 1-CPU head, so the server lands on a GPU node."""
    layout = raytf.ParameterServer(workers=2, ps=1, use_gpu=True, cpus_per_ps=2)
    result = raytf.fit(
        workloads.mlp, workloads.data, global_batch_size=64, layout=layout, verbose=False
    )
    for w in result.workers:  # each GPU worker: exactly the GPU Ray gave it
        assert len(w.gpu_ids) == 1 and w.cuda_visible_devices == w.gpu_ids[0]
    (server,) = result.servers
    assert server.node_id in cluster["one_gpu"] | {cluster["two_gpu"]}
    # A CPU actor on a GPU node (workers with use_gpu=False take the same path).
    assert server.gpu_ids == () and server.cuda_visible_devices == ""

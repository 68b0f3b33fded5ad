"""cluster.yaml against Ray's own cluster-launcher schema, and the facts the README states."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def config():
    with open(os.path.join(ROOT, "cluster.yaml")) as f:
        return yaml.safe_load(f)


def test_valid_against_rays_schema(config):
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    schema_path = os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")
    with open(schema_path) as f:
        jsonschema.validate(config, json.load(f))
    validate_config(prepare_config(config))  # what `ray up` runs, defaults filled in


def test_cpu_head_gpu_pool_and_cpu_pool(config):
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"] == {"CPU": 0} and "GPU" not in head["resources"]
    gpu_pools = {n: t for n, t in types.items() if t["resources"].get("GPU", 0) >= 2}
    assert gpu_pools, "a pool of multi-GPU nodes"
    # raytf plans on the nodes that are up: keep some GPU nodes, let the autoscaler add more.
    assert all(1 <= t["min_workers"] < t["max_workers"] for t in gpu_pools.values())
    cpu_pools = [t for n, t in types.items() if n != "head" and "GPU" not in t["resources"]]
    assert cpu_pools, "CPU-only nodes for parameter servers"


def test_setup_installs_raytf_with_cuda_tensorflow_on_gpu_nodes_only(config):
    import ray

    for name, node in config["available_node_types"].items():
        commands = " ".join(node.get("worker_setup_commands", []))
        extra = "gpu" if node["resources"].get("GPU") else "cpu"
        assert f"raytf[{extra},examples]" in commands, name  # examples: the demo's sklearn
    head = " ".join(config["head_setup_commands"])
    assert "raytf[cpu,examples]" in head
    assert config["file_mounts"] == {"~/raytf": "."}
    major_minor = ".".join(ray.__version__.split(".")[:2])
    assert any(f"ray[default,tune]=={major_minor}" in c for c in config["setup_commands"])


def test_only_ssh_is_open_to_the_world(config):
    # Ray's AWS launcher gives the group SSH from anywhere plus every port between the group's
    # own nodes, and sends any extra IpPermissions in the same call: repeating SSH there makes
    # AWS reject the request, and anything else would open more. So: none.
    assert config["provider"]["security_group"] == {"GroupName": "raytf-cluster"}
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start
    assert 5 <= config["idle_timeout_minutes"] <= 30


def test_python_311_images_match_the_ray_version(config):
    import ray

    images = [config["docker"]["image"], config["docker"]["head_image"]]
    images += [
        t["docker"]["worker_image"]
        for t in config["available_node_types"].values()
        if "docker" in t
    ]
    for image in images:
        assert image.startswith(f"rayproject/ray:{ray.__version__}-py311-"), image
    assert config["docker"]["image"].endswith("-gpu")


def test_docs_table_matches_the_yaml(config):
    with open(os.path.join(ROOT, "docs", "clusters.md")) as f:
        readme = f.read()
    section = readme.split("## cluster.yaml and `ray up`", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\S+) \| (\d+) \| (\d+) \| (\d+)-(\d+) \|", section, re.M)
    assert rows, "the node-type table in docs/clusters.md"
    types = config["available_node_types"]
    assert {r[0] for r in rows} == set(types)
    for name, instance, cpus, gpus, low, high in rows:
        node = types[name]
        assert node["node_config"]["InstanceType"] == instance
        assert node["resources"].get("CPU") == int(cpus)
        assert node["resources"].get("GPU", 0) == int(gpus)
        if name != config["head_node_type"]:
            assert (node["min_workers"], node["max_workers"]) == (int(low), int(high))

"""Ranking, best configuration and best.yaml from Tune results, without Ray (fake results)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

import raytf
from raytf._internal.experiment import Experiment, load_experiment
from raytf._internal.sweep_report import NEVER, rank, write_best_experiment
from raytf.sweep import SweepResult, infer_mode


@dataclass
class FakeResult:
    config: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None


def ranked(results, metric="val_accuracy", mode="max", epochs=2):
    return rank(results, metric, mode, ("name",), epochs)


def names(rows):
    return [r["config"]["name"] for r in rows]


def test_best_first_ties_to_the_faster_failures_last():
    rows = ranked(
        [
            FakeResult({"name": "slow"}, {"val_accuracy": 0.9, "throughput": 10, "epoch": 2}),
            FakeResult({"name": "boom"}, error=RuntimeError("x\nValueError: bad lr")),
            FakeResult({"name": "fast"}, {"val_accuracy": 0.9, "throughput": 50, "epoch": 2}),
            FakeResult({"name": "best"}, {"val_accuracy": 0.95, "throughput": 1, "epoch": 2}),
            FakeResult({"name": "nan"}, {"val_accuracy": math.nan, "throughput": 99, "epoch": 2}),
            FakeResult({"name": "cut"}, {"val_accuracy": 0.99, "throughput": 9, "epoch": 1}),
            FakeResult(
                {"name": "huge"},
                error=RuntimeError(
                    "ray.exceptions.RayTaskError\nraytf.errors.PlacementError: never"
                ),
            ),
        ]
    )
    assert names(rows) == ["best", "fast", "slow", "nan", "cut", "boom", "huge"]
    statuses = {r["config"]["name"]: r["status"] for r in rows}
    assert statuses["cut"] == "stopped early" and statuses["boom"] == "error"
    assert statuses["huge"] == "impossible"
    assert rows[-1]["error"] == "PlacementError: never"


def test_epochs_in_the_space_are_each_trials_own():
    (row,) = ranked([FakeResult({"name": "a", "epochs": 5}, {"val_accuracy": 1.0, "epoch": 5})])
    assert row["status"] == "ok"


def test_an_unreached_target_is_never_the_best():
    rows = rank(
        [FakeResult({"name": "a"}, {"time_to_target_s": NEVER, "epoch": 2})],
        "time_to_target_s",
        "min",
        ("name",),
        2,
    )
    result = SweepResult(
        grid=None,
        metric="time_to_target_s",
        mode="min",
        rows=rows,
        wall_time_s=1,
        trial_train_s=1,
        trial_total_s=1,
        path="/tmp/x",
    )
    assert result.best_config is None and "never" in result.table()


@pytest.mark.parametrize(
    ("metric", "mode"),
    [
        ("val_accuracy", "max"),
        ("throughput", "max"),
        ("val_auc", "max"),
        ("loss", "min"),
        ("val_mse", "min"),
        ("time_to_target_s", "min"),
        ("f1_macro", None),
    ],
)
def test_mode_from_the_metric_name(metric, mode):
    assert infer_mode(metric) == mode


def test_best_yaml_rebuilds_a_layout_object(tmp_path):
    base = load_experiment("experiments/digits.py")
    experiment = Experiment(
        path="x",
        model=base.model,
        data=base.data,
        config={"epochs": 3, "global_batch_size": 64},
        module_path="experiments/digits.py",
    )
    best = {"name": raytf.AllReduce(workers=2), "lr": 0.003}
    rows = [{"config": best, "status": "ok", "value": 0.9, "throughput": 1, "error": None}]
    result = SweepResult(
        grid=None,
        metric="val_accuracy",
        mode="max",
        rows=rows,
        wall_time_s=1,
        trial_train_s=1,
        trial_total_s=1,
        path=str(tmp_path),
    )
    best["layout"] = best.pop("name")
    path = write_best_experiment(result, experiment, frozenset({"lr"}), str(tmp_path / "b.yaml"))
    with open(path) as f:
        config = yaml.safe_load(f)["config"]
    assert config["layout"] == "all-reduce" and config["workers"] == 2
    assert config["model_args"] == {"lr": 0.003} and config["epochs"] == 3
    again = load_experiment(path)  # and raytf run takes it
    assert again.config["workers"] == 2

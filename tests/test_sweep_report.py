"""Ranking, best configuration and best.yaml from Tune results, without Ray (fake results)."""

from __future__ import annotations

import itertools
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


def swept(rows, metric, mode, path="/tmp/x"):
    return SweepResult(
        grid=None,
        metric=metric,
        mode=mode,
        rows=rows,
        wall_time_s=1,
        trial_train_s=1,
        trial_total_s=1,
        path=path,
    )


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
    result = swept(rows, "time_to_target_s", "min", "/tmp/x")
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
    result = swept(rows, "val_accuracy", "max", str(tmp_path))
    best["layout"] = best.pop("name")
    path = write_best_experiment(result, experiment, frozenset({"lr"}), str(tmp_path / "b.yaml"))
    with open(path) as f:
        config = yaml.safe_load(f)["config"]
    assert config["layout"] == "all-reduce" and config["workers"] == 2
    assert config["model_args"] == {"lr": 0.003} and config["epochs"] == 3
    again = load_experiment(path)  # and raytf run takes it
    assert again.config["workers"] == 2


def test_plot_tick_labels_do_not_run_into_each_other():
    """Throughputs in the tens of thousands once printed as '0 1000020000300004000050000'."""
    from raytf._internal.sweep_report import figure, short_number

    rows = ranked(
        [
            FakeResult(
                {"name": f"layout=parameter-server workers=2 ps=1 staleness={i} lr=0.01"},
                {"val_accuracy": 0.9, "throughput": t, "epoch": 2},
            )
            for i, t in enumerate([52_000, 31_000, 4_500, 17_250])
        ]
    )
    result = swept(rows, "val_accuracy", "max", "/tmp/x")
    fig = figure(result)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
        assert len(boxes) >= 2
        for left, right in itertools.pairwise(boxes):
            assert left.x1 < right.x0, [t.get_text() for t in ax.get_xticklabels()]
    assert [short_number(v) for v in (52_000, 1_500_000, 0.953, 0)] == ["52k", "1.5M", "0.953", "0"]

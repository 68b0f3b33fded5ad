"""Turning a Tune ResultGrid into raytf's ranking, table, plot and best experiment file."""

from __future__ import annotations

import math
import os
from typing import Any

import yaml

OK = ("ok", "stopped early")


def _error_text(error: BaseException) -> str:
    """The line a user needs from a trial's error (raytf's own message when there is one)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):
        if "raytf.errors." in line or line.startswith(("PlacementError", "ConfigError")):
            return line.split("raytf.errors.")[-1][:400]
    return (lines[-1] if lines else type(error).__name__)[:400]


def _label(config: dict[str, Any]) -> str:
    def show(value: Any) -> str:
        describe = getattr(value, "describe", None)  # layout objects
        return describe() if callable(describe) else str(value)

    return ", ".join(f"{k}={show(v)}" for k, v in config.items())


def rank(grid: Any, metric: str, mode: str, keys: tuple[str, ...], epochs: int) -> list[dict]:
    rows = []
    for i in range(len(grid)):
        res = grid[i]
        metrics = dict(res.metrics or {})
        error = None
        if res.error is not None:
            error = _error_text(res.error)
            status = "impossible" if "PlacementError" in error else "error"
        else:
            status = "ok" if metrics.get("epoch", 0) >= epochs else "stopped early"
        rows.append(
            {
                "trial": i,
                "config": {k: res.config.get(k) for k in keys},
                "status": status,
                "value": metrics.get(metric),
                "throughput": metrics.get("throughput"),
                "epochs": metrics.get("epoch"),
                "train_s": metrics.get("train_s"),
                "startup_s": metrics.get("startup_s"),
                "error": error,
                "metrics": metrics,
            }
        )

    def key(row: dict) -> tuple:
        value = row["value"]
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        score = 0.0 if missing else (-value if mode == "max" else value)
        # Ties on the objective go to the faster configuration.
        return (
            row["status"] not in OK,
            row["status"] != "ok",
            missing,
            score,
            -(row["throughput"] or 0),
        )

    return sorted(rows, key=key)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value) or value >= 1e12:  # raytf.sweep.NEVER: target not reached
            return "never"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4f}"
    return str(value)


def format_table(result: Any) -> str:
    header = ["rank", "configuration", "status", result.metric, "examples/s", "epochs", "train s"]
    body = []
    for n, row in enumerate(result.rows, 1):
        body.append(
            [
                str(n),
                _label(row["config"]),
                row["status"],
                _fmt(row["value"]),
                _fmt(row["throughput"]),
                _fmt(row["epochs"]),
                "-" if row["train_s"] is None else f"{row['train_s']:.1f}",
            ]
        )
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    for row in result.rows:
        if row["error"]:
            lines.append(f"trial {_label(row['config'])}: {row['status']}: {row['error']}")
    lines.append(
        f"sweep wall time {result.wall_time_s:.1f}s; trials trained {result.trial_train_s:.1f}s "
        f"in all ({result.trial_total_s:.1f}s with start-up), ranked by {result.metric} "
        f"({result.mode})."
    )
    if result.best_config is not None:
        lines.append(f"best: {_label(result.best_config)}")
    if result.plot_path:
        lines.append(f"plot: {result.plot_path}")
    if result.best_experiment_path:
        lines.append(f"rerun the best: raytf run {result.best_experiment_path}")
    return "\n".join(lines)


def write_plot(result: Any, path: str) -> str | None:
    """Throughput and the objective per configuration, as a PNG beside Tune's results."""
    rows = [r for r in result.rows if r["status"] in OK]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [_label(r["config"]) for r in rows]
    panels = [("examples/s (steady state)", [r["throughput"] or 0 for r in rows])]
    if result.metric != "throughput":
        values = [r["value"] for r in rows]
        values = [0 if v is None or math.isinf(v) or v >= 1e12 else v for v in values]
        panels.append((f"{result.metric} ({result.mode})", values))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6 * len(panels), 0.6 * len(rows) + 1.5), squeeze=False
    )
    for ax, (title, values) in zip(axes[0], panels, strict=True):
        ax.barh(range(len(rows)), values, color="#3b75af")
        ax.set_yticks(range(len(rows)), labels)
        ax.invert_yaxis()  # best at the top
        ax.set_title(title)
        for y, v in enumerate(values):
            ax.text(v, y, f" {_fmt(float(v))}", va="center", fontsize=8)
        low, high = min(values), max(values)
        if low > 0 and high - low < 0.5 * high:  # zoom in where the bars differ little
            ax.set_xlim(low - (high - low or high * 0.05), high + 0.15 * (high - low or high))
    fig.suptitle(f"raytf sweep, ranked by {result.metric}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_best_experiment(result: Any, experiment: Any, path: str) -> str | None:
    """The best configuration as a YAML experiment that `raytf run` takes."""
    from raytf.sweep import _merge

    best = result.best_config
    source = getattr(experiment, "module_path", None)
    if best is None or not source:
        return None
    params = frozenset(
        k for k in best if k not in experiment.config and k in _model_params_of(experiment)
    )
    config = _merge(experiment.config, best, params)
    document = {"experiment": os.path.abspath(source), "config": config}
    if experiment.targets:
        document["targets"] = dict(experiment.targets)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"# Best of the sweep in {result.path}, by {result.metric} ({result.mode}).\n")
        yaml.safe_dump(document, f, sort_keys=False)
    return path


def _model_params_of(experiment: Any) -> frozenset[str]:
    from raytf.sweep import _model_params

    return _model_params(experiment.model)

"""Turning a Tune ResultGrid into raytf's ranking, table, plot and best experiment file."""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from collections.abc import Mapping
from typing import Any

import yaml

OK = ("ok", "stopped early")
#: Reported as time_to_target_s until the target is reached (Tune's loggers reject inf).
NEVER = 1e12


def merge_config(
    base: Mapping[str, Any], sampled: Mapping[str, Any], model_params: frozenset[str]
) -> dict[str, Any]:
    """Sampled values over the base config; model-builder parameters go under model_args."""
    merged = dict(base)
    model_args = dict(base.get("model_args") or {})
    for key, value in sampled.items():
        if key in model_params:
            model_args[key] = value
        elif key == "model_args":
            model_args.update(value)
        else:
            merged[key] = value
    if model_args:
        merged["model_args"] = model_args
    return merged


def has_value(row: dict[str, Any]) -> bool:
    """A finished trial that produced its metric (and, for a target, reached it)."""
    value = row["value"]
    if row["status"] not in OK or value is None:
        return False
    return not (isinstance(value, float) and (math.isnan(value) or value >= NEVER))


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
            wanted = res.config.get("epochs", epochs)  # epochs may be part of the space
            status = "ok" if metrics.get("epoch", 0) >= wanted else "stopped early"
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
        missing = not has_value(row)
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
        if math.isinf(value) or value >= NEVER:  # the target was not reached
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
    fig = figure(result)
    if fig is None:
        return None
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def figure(result: Any) -> Any:
    """The plot's matplotlib figure (None when no trial finished)."""
    rows = [r for r in result.rows if r["status"] in OK]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    # Wrapped, and on the first panel only: long labels squeezed the bars' axes.
    labels = [textwrap.fill(_label(r["config"]), 32) for r in rows]
    panels = [("examples/s (steady state)", [r["throughput"] or 0 for r in rows])]
    if result.metric != "throughput":
        values = [r["value"] for r in rows]
        values = [0 if v is None or math.isinf(v) or v >= NEVER else v for v in values]
        panels.append((f"{result.metric} ({result.mode})", values))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6 * len(panels), 0.8 * len(rows) + 1.5), squeeze=False
    )
    for i, (ax, (title, values)) in enumerate(zip(axes[0], panels, strict=True)):
        ax.barh(range(len(rows)), values, color="#3b75af")
        ax.set_yticks(range(len(rows)), labels if i == 0 else [""] * len(rows))
        ax.invert_yaxis()  # best at the top
        ax.set_title(title)
        for y, v in enumerate(values):
            ax.text(v, y, f" {_fmt(float(v))}", va="center", fontsize=8)
        low, high = min(values), max(values)
        if low > 0 and high - low < 0.5 * high:  # zoom in where the bars differ little
            ax.set_xlim(low - (high - low or high * 0.05), high + 0.15 * (high - low or high))
        # Few, short tick labels (12k, not 12000): five-digit ticks ran into each other.
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: short_number(v)))
    fig.suptitle(f"raytf sweep, ranked by {result.metric}")
    fig.tight_layout()
    return fig


def short_number(value: float) -> str:
    """A tick label: 12k, 1.5M, 0.95."""
    size = abs(value)
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if size >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def _plain(value: Any) -> Any:
    """A layout object as the config keys that rebuild it; other values unchanged."""
    from raytf._internal.experiment import LAYOUT_KEYS
    from raytf.layouts import Layout

    if not isinstance(value, Layout):
        return value
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    keep = {k: v for k, v in fields.items() if k in LAYOUT_KEYS or k == "use_gpu"}
    return {"layout": value.name, **keep}


def write_best_experiment(
    result: Any, experiment: Any, model_params: frozenset[str], path: str
) -> str | None:
    """The best configuration as a YAML experiment that `raytf run` takes."""
    best = result.best_config
    if best is None or not getattr(experiment, "module_path", None):
        return None
    config = merge_config(experiment.config, best, model_params)
    layout = config.pop("layout", None)
    plain = _plain(layout)
    config.update(plain if isinstance(plain, dict) else {"layout": plain} if plain else {})
    document = {"experiment": os.path.abspath(experiment.module_path), "config": config}
    if experiment.targets:
        document["targets"] = dict(experiment.targets)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"# Best of the sweep in {result.path}, by {result.metric} ({result.mode}).\n")
        yaml.safe_dump(document, f, sort_keys=False)
    return path

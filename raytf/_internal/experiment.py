"""Experiment files: a Python file defining the model and data, or a YAML file naming one.

This is the one place where file and flag values become :func:`raytf.fit` arguments, so the
CLI, YAML and (later) Tune search spaces are validated the same way.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raytf._internal.cluster import ClusterInfo
from raytf._internal.selection import resolve_use_gpu
from raytf.errors import ConfigError
from raytf.layouts import Layout, resolve

#: Keys an experiment's ``config`` may set, passed to raytf.fit as they are.
FIT_KEYS = frozenset(
    {
        "global_batch_size",
        "epochs",
        "layout",
        "replicas",
        "use_gpu",
        "steps_per_epoch",
        "validation_steps",
        "checkpoint_dir",
        "checkpoint_every",
        "resume",
        "seed",
        "steps_per_execution",
    }
)
#: Keys that shape a named layout (fields of its config object).
LAYOUT_KEYS = frozenset({"workers", "devices", "engine", "communication"})

MODEL_NAMES = ("build_model", "model")
DATA_NAMES = ("make_dataset", "data")
VALIDATION_NAMES = ("make_validation_dataset", "validation_data")


@dataclass(frozen=True)
class Experiment:
    path: str
    model: Callable[[], Any]
    data: Callable[[Any], Any]
    validation_data: Callable[[Any], Any] | None = None
    evaluate: Callable[[Any], Mapping[str, float]] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    targets: dict[str, float] = field(default_factory=dict)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Experiment:
        given = {k: v for k, v in overrides.items() if v is not None}
        check_config_keys(given, "command-line flags")
        return dataclasses.replace(self, config={**self.config, **given})


def check_config_keys(config: Mapping[str, Any], where: str) -> None:
    unknown = sorted(set(config) - FIT_KEYS - LAYOUT_KEYS)
    if unknown:
        raise ConfigError(
            f"Unknown key(s) {unknown} in {where}; valid keys are {sorted(FIT_KEYS | LAYOUT_KEYS)}."
        )


def _pick(module: Any, names: tuple[str, ...], path: str, required: bool) -> Any:
    for name in names:
        value = getattr(module, name, None)
        if value is not None:
            if not callable(value):
                raise ConfigError(f"{path}: {name} must be a function, found {value!r:.60}.")
            return value
    if required:
        raise ConfigError(
            f"{path} defines none of {list(names)}; an experiment file needs a model builder "
            "(build_model) and a data function (make_dataset(ctx))."
        )
    return None


def _import_file(path: str) -> Any:
    from ray import cloudpickle

    name = "raytf_experiment_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"Cannot import {path!r} as Python.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    # Ray workers cannot import this file by name: ship its functions by value.
    cloudpickle.register_pickle_by_value(module)
    return module


def load_experiment(path: str) -> Experiment:
    """Read a ``.py`` experiment, or a ``.yaml`` one whose ``experiment:`` names a ``.py``."""
    if not os.path.isfile(path):
        raise ConfigError(
            f"Experiment file {path!r} does not exist; pass a .py or .yaml file, e.g. "
            "experiments/digits.py."
        )
    if path.endswith((".yaml", ".yml")):
        import yaml

        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        if not isinstance(raw, dict) or "experiment" not in raw:
            raise ConfigError(
                f"{path}: a YAML experiment is a mapping with 'experiment: file.py' and an "
                f"optional 'config:' mapping; found {type(raw).__name__} keys "
                f"{sorted(raw) if isinstance(raw, dict) else ''}."
            )
        extra = sorted(set(raw) - {"experiment", "config", "targets"})
        if extra:
            raise ConfigError(
                f"{path}: unknown top-level key(s) {extra}; use experiment, config and targets."
            )
        target = os.path.join(os.path.dirname(os.path.abspath(path)), raw["experiment"])
        base = load_experiment(target)
        config = raw.get("config") or {}
        check_config_keys(config, path)
        return dataclasses.replace(
            base,
            path=path,
            config={**base.config, **config},
            targets={**base.targets, **(raw.get("targets") or {})},
        )
    if not path.endswith(".py"):
        raise ConfigError(f"Experiment file {path!r} must end in .py, .yaml or .yml.")
    module = _import_file(path)
    config = dict(getattr(module, "config", {}) or {})
    check_config_keys(config, path)
    return Experiment(
        path=path,
        model=_pick(module, MODEL_NAMES, path, True),
        data=_pick(module, DATA_NAMES, path, True),
        validation_data=_pick(module, VALIDATION_NAMES, path, False),
        evaluate=_pick(module, ("evaluate",), path, False),
        config=config,
        targets=dict(getattr(module, "targets", {}) or {}),
    )


def layout_from_config(config: Mapping[str, Any], cluster: ClusterInfo) -> str | Layout:
    """``layout`` plus shaping keys (workers, devices, ...) -> a name or a layout object."""
    name = config.get("layout", "auto")
    shaping = {k: config[k] for k in LAYOUT_KEYS if config.get(k) is not None}
    if not shaping:
        return name
    if name == "auto":
        raise ConfigError(
            f"{sorted(shaping)} shape a named layout; add --layout all-reduce or in-graph "
            "(or leave them out and let raytf choose)."
        )
    cls, defaults = resolve(name)
    accepted = {f.name for f in dataclasses.fields(cls)}
    wrong = sorted(set(shaping) - accepted)
    if wrong:
        raise ConfigError(
            f"Layout {name!r} does not take {wrong}; it takes {sorted(accepted & LAYOUT_KEYS)}."
        )
    use_gpu = resolve_use_gpu(cluster, config.get("use_gpu"))
    replicas = config.get("replicas")
    options = {**defaults, **shaping}
    if replicas is not None and not {"workers", "devices"} & set(shaping):
        return cls.for_replicas(replicas, use_gpu, **options)
    layout = cls(**options, use_gpu=use_gpu)
    if replicas is not None and replicas != layout.num_replicas:
        raise ConfigError(
            f"replicas={replicas} disagrees with {sorted(shaping.items())}, which make "
            f"{layout.num_replicas} replica(s); give one or the other."
        )
    return layout


def fit_kwargs(experiment: Experiment, cluster: ClusterInfo) -> dict[str, Any]:
    config = experiment.config
    kwargs = {k: v for k, v in config.items() if k in FIT_KEYS}
    kwargs["layout"] = layout_from_config(config, cluster)
    if not isinstance(kwargs["layout"], str):
        kwargs.pop("replicas", None)
        kwargs.pop("use_gpu", None)
    if "global_batch_size" not in kwargs:
        raise ConfigError(
            f"{experiment.path}: no global_batch_size; set it in the file's config or pass "
            "--batch N."
        )
    return kwargs

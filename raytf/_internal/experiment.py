"""Experiment files: a Python file defining the model and data, or a YAML file naming one.

This is the one place where file and flag values become :func:`raytf.fit` arguments, so the
CLI, YAML and (later) Tune search spaces are validated the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raytf._internal.cluster import ClusterInfo
from raytf._internal.resolve import LayoutRequest
from raytf.errors import ConfigError
from raytf.layouts import layout_option_names

#: Config keys that make the run's FailurePolicy.
FAILURE_KEYS = (
    "max_failures",
    "checkpoint_every_steps",
    "checkpoint_every_s",
    "min_workers",
    "elastic_batch",
    "replace_within_s",
)
#: Keys an experiment's ``config`` may set, passed to raytf.fit (failure keys as a policy).
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
        "keep_checkpoints",
        "resume",
        "seed",
        "steps_per_execution",
        "stragglers",
        "preemptible",
        "runtime_env",
        # Which columns of a Ray Dataset or files are which; Keras's fit options.
        "feature_columns",
        "label_columns",
        "sample_weight_column",
        "class_weight",
        "validation_freq",
        "initial_epoch",
        "shuffle",
        *FAILURE_KEYS,
    }
)
#: Keys that shape a named layout: the fields of the registered layouts' config objects, so a
#: new layout's options work in YAML, flags and sweeps without touching this file.
LAYOUT_KEYS = layout_option_names()
#: Keyword arguments for the experiment's model builder (e.g. a learning rate to sweep).
MODEL_ARGS = "model_args"

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
    space: dict[str, Any] = field(default_factory=dict)  # for `raytf sweep`
    module_path: str | None = None  # the .py file, also when read through a YAML

    def with_overrides(self, overrides: Mapping[str, Any]) -> Experiment:
        given = {k: v for k, v in overrides.items() if v is not None}
        check_config_keys(given, "command-line flags")
        return dataclasses.replace(self, config={**self.config, **given})


def check_config_keys(config: Mapping[str, Any], where: str) -> None:
    valid = FIT_KEYS | LAYOUT_KEYS | {MODEL_ARGS}
    unknown = sorted(set(config) - valid)
    if unknown:
        raise ConfigError(f"Unknown key(s) {unknown} in {where}; valid keys are {sorted(valid)}.")
    args = config.get(MODEL_ARGS)
    if args is not None and not isinstance(args, dict):
        raise ConfigError(
            f"{MODEL_ARGS} in {where} must be a mapping of the model builder's keyword "
            f"arguments, received {args!r}."
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
        extra = sorted(set(raw) - {"experiment", "config", "targets", "space"})
        if extra:
            raise ConfigError(
                f"{path}: unknown top-level key(s) {extra}; use experiment, config, targets "
                "and space."
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
            space={**base.space, **space_from_yaml(raw.get("space") or {}, path)},
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
        space=dict(getattr(module, "space", {}) or {}),
        module_path=path,
    )


#: YAML spellings of Tune's search primitives: ``lr: {loguniform: [1e-4, 1e-2]}``.
SEARCH_PRIMITIVES = ("grid_search", "choice", "uniform", "loguniform", "randint")


def space_from_yaml(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``{key: {grid_search: [...]}}`` and friends -> Tune search-space objects."""
    from ray import tune

    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: space must be a mapping, found {type(raw).__name__}.")
    space: dict[str, Any] = {}
    for key, value in raw.items():
        if (
            isinstance(value, Mapping)
            and len(value) == 1
            and next(iter(value)) in SEARCH_PRIMITIVES
        ):
            ((kind, args),) = value.items()
            if not isinstance(args, list):
                raise ConfigError(f"{where}: space.{key}.{kind} takes a list, found {args!r}.")
            space[key] = (
                getattr(tune, kind)(args)
                if kind in ("grid_search", "choice")
                else (getattr(tune, kind)(*args))
            )
        elif isinstance(value, Mapping):
            raise ConfigError(
                f"{where}: space.{key} is {dict(value)!r}; write a value, or one of "
                f"{list(SEARCH_PRIMITIVES)} with a list, e.g. {{grid_search: [1, 2]}}."
            )
        else:
            space[key] = value
    return space


def layout_kwargs(config: Mapping[str, Any], cluster: ClusterInfo) -> dict[str, Any]:
    """``layout`` (with ``replicas``, ``use_gpu`` and the hints) for raytf.fit; a layout that
    the config shapes (workers, devices, ...) is made here, through the one conversion."""
    request = LayoutRequest.from_config(config)
    hints = {"stragglers": request.stragglers, "preemptible": request.preemptible}
    if request.options:
        layout, _ = request.resolve(cluster)
        return {"layout": layout, **hints}
    return {
        "layout": request.layout,
        "replicas": request.replicas,
        "use_gpu": request.use_gpu,
        **hints,
    }


def model_builder(model: Callable[[], Any], args: Mapping[str, Any] | None) -> Callable[[], Any]:
    """The builder with ``model_args`` bound; unknown names fail here, not in an actor."""
    if not args:
        return model
    try:
        params = inspect.signature(model).parameters
    except (TypeError, ValueError):
        return functools.partial(model, **args)
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = sorted(set(args) - set(params))
    if unknown and not takes_kwargs:
        raise ConfigError(
            f"model_args {unknown} are not parameters of {getattr(model, '__name__', model)}"
            f"{inspect.signature(model)}; add them to its signature or drop them."
        )
    return functools.partial(model, **args)


def fit_kwargs(experiment: Experiment, cluster: ClusterInfo) -> dict[str, Any]:
    """Keyword arguments for raytf.fit, model and data included."""
    config = experiment.config
    kwargs = {k: v for k, v in config.items() if k in FIT_KEYS}
    kwargs["model"] = model_builder(experiment.model, config.get(MODEL_ARGS))
    kwargs["data"] = experiment.data
    kwargs["validation_data"] = experiment.validation_data
    for key in ("replicas", "use_gpu", "stragglers", "preemptible"):
        kwargs.pop(key, None)
    policy = {k: kwargs.pop(k) for k in FAILURE_KEYS if k in kwargs}
    if policy:
        from raytf.config import FailurePolicy

        kwargs["failures"] = FailurePolicy(**policy)
    kwargs.update(layout_kwargs(config, cluster))
    if "global_batch_size" not in kwargs:
        raise ConfigError(
            f"{experiment.path}: no global_batch_size; set it in the file's config or pass "
            "--batch N."
        )
    return kwargs

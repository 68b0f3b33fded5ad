"""How a sweep searches and schedules: Tune scheduler and search-algorithm names checked and
built, PBT's mutations, and which interrupted sweep to resume. Pure checks before Tune runs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from raytf.errors import ConfigError

#: Objectives that are not per-epoch metrics (raytf.sweep's own names).
THROUGHPUT = "throughput"
TIME_TO_TARGET = "time_to_target_s"


SCHEDULERS = ("asha", "pbt")
SEARCHERS = {
    # name: (Tune's module, its class, the library to pip install, that library's module)
    "optuna": ("ray.tune.search.optuna", "OptunaSearch", "optuna", "optuna"),
    "hyperopt": ("ray.tune.search.hyperopt", "HyperOptSearch", "hyperopt", "hyperopt"),
    "bayesopt": (
        "ray.tune.search.bayesopt",
        "BayesOptSearch",
        "bayesian-optimization",
        "bayes_opt",
    ),
}


def _is_grid(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {"grid_search"}


def check_scheduler(
    scheduler: Any, metric: str, space: Mapping[str, Any], params: frozenset
) -> Any:
    """Check ``scheduler`` (a name or a Tune TrialScheduler) before anything starts."""
    from ray.tune.schedulers import TrialScheduler

    if scheduler is None or isinstance(scheduler, TrialScheduler):
        return scheduler
    if scheduler not in SCHEDULERS:
        raise ConfigError(
            f"scheduler must be one of {SCHEDULERS}, a ray.tune TrialScheduler, or None; "
            f"received {scheduler!r}."
        )
    if "epochs" in space:
        raise ConfigError(
            f"scheduler={scheduler!r} needs the same epochs for every trial; set epochs= "
            "outside the space."
        )
    if metric in (THROUGHPUT, TIME_TO_TARGET):
        raise ConfigError(
            f"scheduler={scheduler!r} decides on a per-epoch metric; metric={metric!r} is only "
            "meaningful at the end. Use metric='val_accuracy' (or another log), or no scheduler."
        )
    if scheduler == "pbt" and not mutations(space, params):
        raise ConfigError(
            "scheduler='pbt' perturbs float parameters of your model builder (e.g. lr) that "
            f"the space samples; the space has {sorted(space)}, none of them such a parameter "
            "with several float values. Add one, e.g. space={'lr': tune.loguniform(1e-4, "
            "1e-1)}, or pass a ray.tune PopulationBasedTraining with hyperparam_mutations."
        )
    return scheduler


def mutations(space: Mapping[str, Any], params: frozenset) -> dict[str, Any]:
    """PBT's mutations: the model parameters the space varies (a grid as a list of choices)."""
    from ray.tune.search.sample import Categorical, Float

    out: dict[str, Any] = {}
    for key, value in space.items():
        if key not in params:
            continue
        # Only rates and the like: a clone restores the other trial's checkpoint, which a
        # model of another shape (units, layers: integers, names) could not take.
        if _is_grid(value) and len(value["grid_search"]) > 1:
            if all(_is_float(v) for v in value["grid_search"]):
                out[key] = list(value["grid_search"])
        elif isinstance(value, Float) or (
            isinstance(value, Categorical) and all(_is_float(v) for v in value.categories)
        ):
            out[key] = value
    return out


def clones(scheduler: Any) -> bool:
    """Does ``scheduler`` restore trials from other trials' checkpoints (PBT, PB2)?"""
    from ray.tune.schedulers import PopulationBasedTraining

    return scheduler == "pbt" or isinstance(scheduler, PopulationBasedTraining)


def _is_float(value: Any) -> bool:
    return isinstance(value, float)


def built_scheduler(
    scheduler: Any, space: Mapping[str, Any], params: frozenset, config: dict, num_samples: int
) -> Any:
    """The Tune scheduler for a name (a user's object as it is)."""
    epochs = int(config.get("epochs", 1))
    if scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(max_t=epochs, grace_period=1)
    if scheduler == "pbt":
        from ray.tune.schedulers import PopulationBasedTraining

        population = num_samples
        for value in space.values():
            population *= len(value["grid_search"]) if _is_grid(value) else 1
        # Every epoch is checkpointed and reported: a trial may clone another's each epoch.
        # Asynchronous, as Tune's default: synchronous PBT pauses (stops and restarts) every
        # trial at every perturbation. Pass a PopulationBasedTraining object for other
        # settings. Tune's bottom quarter is nobody in a population under 4: one trial then.
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=1,
            hyperparam_mutations=mutations(space, params),
            quantile_fraction=min(0.5, max(0.25, 1 / population)),
        )
    return scheduler


def check_search_alg(search_alg: Any, space: Mapping[str, Any]) -> Any:
    """A Tune Searcher for a name whose library is installed (a user's object as it is)."""
    import importlib

    from ray.tune.search import SearchAlgorithm, Searcher

    if search_alg is None or isinstance(search_alg, SearchAlgorithm):
        return search_alg  # a SearchAlgorithm (BasicVariantGenerator) takes grids itself
    grids = sorted(k for k, v in space.items() if _is_grid(v))
    if grids:
        raise ConfigError(
            f"search_alg={search_alg!r} samples the space, but {grids} are tune.grid_search, "
            "which search algorithms do not take. Use tune.choice([...]) (or ranges such as "
            "tune.loguniform) and num_samples=N."
        )
    if isinstance(search_alg, Searcher):
        return search_alg
    if search_alg not in SEARCHERS:
        raise ConfigError(
            f"search_alg must be one of {sorted(SEARCHERS)}, a ray.tune Searcher, or None; "
            f"received {search_alg!r}."
        )
    module, cls, package, library = SEARCHERS[search_alg]
    try:
        importlib.import_module(library)
        return getattr(importlib.import_module(module), cls)()
    except ImportError as exc:
        extra = " (pip install 'raytf[tune]')" if search_alg == "optuna" else ""
        raise ConfigError(
            f"search_alg={search_alg!r} needs the {package} package, which is not installed "
            f"here: pip install {package}{extra}. ({exc})"
        ) from None


def resumable(storage: str, name: str | None) -> str:
    """The sweep to resume: ``name``, or the newest sweep in ``storage``."""
    from ray import tune

    if name is None:
        names = os.listdir(storage) if os.path.isdir(storage) else []
        found = [d for d in names if tune.Tuner.can_restore(os.path.join(storage, d))]
        if not found:
            raise ConfigError(
                f"resume=True found no sweep to resume in {storage!r}; pass storage_path= "
                "(and name=) of the sweep that was interrupted."
            )
        name = max(found, key=lambda d: os.path.getmtime(os.path.join(storage, d)))
    path = os.path.join(storage, name)
    if not tune.Tuner.can_restore(path):
        raise ConfigError(
            f"resume=True, but {path!r} holds no sweep Tune can restore; check storage_path= "
            "and name=, or drop resume to start a new sweep."
        )
    return name

"""Ray Tune sweeps over strategy configurations: which layout is fastest, or best, here?

Each trial runs :func:`raytf.fit` with one configuration and reserves exactly the Ray
resources of that configuration's layout (an empty head bundle plus the layout's bundles), so
trials with different layouts run side by side when the cluster has room and queue when not.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raytf._internal.checks import positive_int
from raytf._internal.runtime.pool import DEFAULT_IDLE_S, ENV, POOL
from raytf._internal.sweep_report import NEVER, merge_config
from raytf._internal.tune_options import (
    THROUGHPUT,
    TIME_TO_TARGET,
    built_scheduler,
    check_scheduler,
    check_search_alg,
    clones,
    resumable,
)
from raytf._internal.tune_trial import TuneReporter
from raytf.callbacks import RunInfo
from raytf.errors import ConfigError, PlacementError


@dataclass(frozen=True)
class _Spec:
    """What every trial needs, shipped once through Ray's object store."""

    experiment: Any  # raytf._internal.experiment.Experiment
    model_params: frozenset[str]
    target: tuple[str, float] | None


class _TuneReport(TuneReporter):
    """raytf.fit's Tune reports, plus training time, time to the target and what the trial
    reserved."""

    def __init__(self, target: tuple[str, float] | None) -> None:
        super().__init__()
        self.target = target
        self.created = time.time()
        self.started = self.created
        self.reached: float | None = None
        self.resources: dict[str, float] = {}

    def on_fit_start(self, run: RunInfo) -> None:
        from ray.util import get_current_placement_group

        self.started = time.time()
        group = get_current_placement_group()
        bundles = group.bundle_specs if group is not None else []
        # What the trial reserved and what its actors got, for the summary and the tests.
        self.resources = {
            "actors": len(run.workers),
            "gpus_assigned": sum(len(w.gpu_ids) for w in run.workers),
            "reserved_cpus": sum(b.get("CPU", 0) for b in bundles),
            "reserved_gpus": sum(b.get("GPU", 0) for b in bundles),
        }

    def extra(self, epoch: int, logs: dict[str, float]) -> dict[str, Any]:
        # A trial Tune restored (a retry, PBT, a resumed sweep) goes on counting.
        carried = self.carried
        train_s = carried.get("train_s", 0.0) + time.time() - self.started
        if self.reached is None and carried.get(TIME_TO_TARGET, NEVER) < NEVER:
            self.reached = carried[TIME_TO_TARGET]
        if self.target and self.reached is None:
            key, value = self.target
            if key in logs and _better_or_equal(logs[key], value, infer_mode(key) or "max"):
                self.reached = train_s
        startup_s = carried.get("startup_s", 0.0) + self.started - self.created
        report = {**self.resources, "train_s": train_s, "startup_s": startup_s}
        if self.target:
            report[TIME_TO_TARGET] = self.reached if self.reached is not None else NEVER
        return report

    def carry(self, report: dict[str, Any]) -> dict[str, Any]:
        return {k: report[k] for k in ("train_s", "startup_s", TIME_TO_TARGET) if k in report}


def _better_or_equal(got: float, want: float, mode: str) -> bool:
    return got >= want if mode == "max" else got <= want


_MAXIMISE = ("accuracy", "acc", "auc", "precision", "recall", "throughput", "examples_per_second")
_MINIMISE = ("loss", "error", "mse", "mae")


def infer_mode(metric: str) -> str | None:
    """'max' or 'min' for metric names whose direction is clear; None when it is not."""
    if metric.endswith("_s") or any(word in metric for word in _MINIMISE):
        return "min"
    if any(word in metric for word in _MAXIMISE):
        return "max"
    return None


def _trial(config: dict[str, Any], spec: _Spec) -> None:
    """One Tune trial: the sampled config on top of the base experiment, run by raytf.fit."""
    from raytf._internal.experiment import fit_kwargs
    from raytf.api import current_cluster, fit

    experiment = dataclasses.replace(
        spec.experiment, config=merge_config(spec.experiment.config, config, spec.model_params)
    )
    kwargs = fit_kwargs(experiment, current_cluster())
    if kwargs.get("checkpoint_dir"):  # a root: each trial checkpoints in its own directory
        from ray import tune

        trial_id = tune.get_context().get_trial_id()
        kwargs["checkpoint_dir"] = os.path.join(kwargs["checkpoint_dir"], str(trial_id))
    if POOL.idle_s is None and ENV not in os.environ:
        POOL.idle_s = DEFAULT_IDLE_S  # Tune reuses this trial's actor: keep raytf's warm
    fit(**kwargs, callbacks=[_TuneReport(spec.target)], verbose=False)


def _model_params(model: Callable[..., Any]) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(model).parameters)
    except (TypeError, ValueError):
        return frozenset()


def _check_space(space: Mapping[str, Any], model_params: frozenset[str], model: Any) -> None:
    from raytf._internal.experiment import FIT_KEYS, LAYOUT_KEYS, MODEL_ARGS

    if not isinstance(space, Mapping) or not space:
        raise ConfigError(
            f"space must be a non-empty mapping of setting -> values, received {space!r}; "
            "e.g. {'layout': tune.grid_search(['towers', 'all-reduce'])}."
        )
    valid = FIT_KEYS | LAYOUT_KEYS | {MODEL_ARGS} | model_params
    unknown = sorted(set(space) - valid)
    if unknown:
        name = getattr(model, "__name__", "the model builder")
        raise ConfigError(
            f"space keys {unknown} are neither raytf settings nor parameters of {name}"
            f"{inspect.signature(model) if model_params else '()'}. Valid: {sorted(valid)}."
        )


def _trial_resources(config: Mapping[str, Any], spec: _Spec, cluster: Any) -> Any:
    """The trial's placement group: an empty head bundle plus its layout's bundles."""
    from ray import tune

    from raytf._internal.resolve import LayoutRequest
    from raytf.api import placement_factory, plan_request

    merged = merge_config(spec.experiment.config, config, spec.model_params)
    try:
        chosen = plan_request(LayoutRequest.from_config(merged), cluster)
    except (PlacementError, ConfigError):
        # Never fits: a token reservation, so the trial starts and reports why at once.
        return tune.PlacementGroupFactory([{"CPU": 0.01}])
    return placement_factory(chosen)


@dataclass(frozen=True)
class SweepResult:
    """Tune's ``ResultGrid`` plus raytf's ranking, plot and best configuration."""

    grid: Any  # ray.tune.ResultGrid
    metric: str
    mode: str
    rows: list[dict[str, Any]]  # ranked, best first; failed trials last
    wall_time_s: float
    trial_train_s: float  # sum over trials of time spent training (after start-up)
    trial_total_s: float  # sum over trials of start-up plus training
    path: str
    plot_path: str | None = None
    best_experiment_path: str | None = None
    keys: tuple[str, ...] = field(default=())

    @property
    def best_config(self) -> dict[str, Any] | None:
        """The top row's configuration; None if no trial produced the metric (or its target)."""
        from raytf._internal.sweep_report import has_value

        ok = [r for r in self.rows if has_value(r)]
        return dict(ok[0]["config"]) if ok else None

    def table(self) -> str:
        from raytf._internal.sweep_report import format_table

        return format_table(self)

    def __str__(self) -> str:
        return self.table()


def sweep(
    model: Callable[..., Any],
    data: Callable[[Any], Any],
    *,
    space: Mapping[str, Any],
    metric: str = THROUGHPUT,
    mode: str | None = None,
    target: tuple[str, float] | None = None,
    validation_data: Callable[[Any], Any] | None = None,
    scheduler: Any = None,
    search_alg: Any = None,
    num_samples: int = 1,
    max_concurrent_trials: int | None = None,
    storage_path: str | None = None,
    name: str | None = None,
    resume: bool = False,
    experiment_file: str | None = None,
    address: str | None = None,
    verbose: bool = True,
    targets: Mapping[str, float] | None = None,
    **config: Any,
) -> SweepResult:
    """Run one Tune trial per configuration in ``space`` and rank them.

    ``space`` maps raytf settings (``layout``, ``workers``, ``devices``, ``strategy``,
    ``global_batch_size``, ...) and parameters of your model builder (``lr``, ...) to values or
    Tune search primitives (``tune.grid_search``, ``tune.choice``, ...). ``metric`` is
    ``"throughput"`` (examples/s), any per-epoch log such as ``"val_accuracy"``, or
    ``"time_to_target_s"`` with ``target=("val_accuracy", 0.95)``. Other keyword arguments
    are fixed :func:`raytf.fit` settings for every trial.

    ``scheduler``: ``"asha"`` stops hopeless trials early; ``"pbt"`` runs Population Based
    Training over the model parameters the space samples (trials clone better ones'
    checkpoints and perturb); or any Tune ``TrialScheduler``. ``search_alg``: ``"optuna"``,
    ``"hyperopt"``, ``"bayesopt"`` (their libraries installed; ``pip install 'raytf[tune]'``
    for Optuna) or any Tune ``Searcher``; sample with ``num_samples=``. Every trial reports
    its epochs and checkpoints to Tune. ``resume=True`` goes on with the sweep ``name`` (the
    newest in ``storage_path`` without one) after its driver died: finished trials are kept,
    the others resume from their last checkpoint.
    """
    from ray import tune

    from raytf._internal.experiment import Experiment, check_config_keys
    from raytf._internal.sweep_report import rank, write_best_experiment, write_plot
    from raytf.api import connect, current_cluster

    check_config_keys(config, "sweep() keyword arguments")
    params = _model_params(model)
    _check_space(space, params, model)
    if metric == TIME_TO_TARGET and target is None:
        raise ConfigError(
            "metric='time_to_target_s' needs target=(metric, value), e.g. "
            "target=('val_accuracy', 0.95)."
        )
    if target is not None and (
        not isinstance(target, (tuple, list)) or len(target) != 2 or not isinstance(target[0], str)
    ):
        raise ConfigError(f"target must be (metric name, value), received {target!r}.")
    mode = mode or infer_mode(metric)
    if mode not in ("min", "max"):
        raise ConfigError(
            f"mode must be 'min' or 'max', received {mode!r}: raytf cannot tell from the name "
            f"{metric!r} whether higher is better; pass mode='max' or mode='min'."
        )
    if metric.startswith("val_") and validation_data is None:
        raise ConfigError(
            f"metric={metric!r} is a validation metric but no validation_data= was given; "
            "pass validation_data=, or rank by a training metric or 'throughput'."
        )
    if "resume" in config or "resume" in space:
        raise ConfigError(
            "resume is not a trial setting of a sweep: each trial resumes from its own Tune "
            "checkpoint when Tune restarts it. To go on with an interrupted sweep, pass "
            "raytf.sweep(..., resume=True) (CLI: --resume)."
        )
    if "checkpoint_dir" in space:
        raise ConfigError(
            "checkpoint_dir cannot vary in the space: it is the root under which each trial "
            "checkpoints in its own directory; pass checkpoint_dir= outside the space."
        )
    scheduler = check_scheduler(scheduler, metric, space, params)
    search_alg = check_search_alg(search_alg, space)
    positive_int("num_samples", num_samples, "It counts trials per configuration.")

    from raytf._internal.runtime import runtime_env as renv

    renv.check(config.get("runtime_env"))
    connect(address)
    cluster = current_cluster()
    if clones(scheduler) and len(cluster.nodes) > 1 and not config.get("checkpoint_dir"):
        raise ConfigError(
            f"PBT clones trials' checkpoints, which raytf's actors write on the nodes they run "
            f"on: on this {len(cluster.nodes)}-node cluster pass checkpoint_dir= on storage "
            "every node can read (NFS, a mounted bucket); each trial checkpoints under it."
        )
    config = dict(config)
    if config.get("runtime_env"):  # uploaded once here: trials run in their own directories
        config["runtime_env"] = renv.for_actors(config["runtime_env"])
    experiment = Experiment(
        path=experiment_file or "<api>",
        model=model,
        data=data,
        validation_data=validation_data,
        config=config,
        targets=dict(targets or {}),
        module_path=experiment_file,
    )
    spec = _Spec(experiment, params, tuple(target) if target else None)
    trainable = tune.with_resources(
        tune.with_parameters(_trial, spec=spec),
        resources=lambda cfg: _trial_resources(cfg, spec, cluster),
    )
    storage = os.path.abspath(storage_path or "raytf-sweeps")
    if resume:
        name = resumable(storage, name)
        tuner = tune.Tuner.restore(
            os.path.join(storage, name),
            trainable,
            resume_unfinished=True,
            resume_errored=True,
            param_space=dict(space),
        )
    else:
        name = name or time.strftime("sweep-%Y%m%d-%H%M%S")
        tuner = tune.Tuner(
            trainable,
            param_space=dict(space),
            tune_config=tune.TuneConfig(
                metric=metric,
                mode=mode,
                # The next trial on the same resources runs in this one's actor and takes
                # the raytf actors it left warm: no new processes, no TensorFlow import.
                reuse_actors=True,
                scheduler=built_scheduler(scheduler, space, params, config, num_samples),
                search_alg=search_alg,
                num_samples=num_samples,
                max_concurrent_trials=max_concurrent_trials,
            ),
            run_config=tune.RunConfig(
                storage_path=storage,
                name=name,
                verbose=1 if verbose else 0,
                # Every epoch reports a checkpoint: the newest two per trial are enough to
                # restore, clone or resume.
                checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            ),
        )
    POOL.clear()  # this driver's warm actors would hold resources the trials need
    started = time.time()
    grid = tuner.fit()
    wall = time.time() - started
    rows = rank(grid, metric, mode, tuple(space), int(config.get("epochs", 1)))
    path = os.path.join(storage, name)
    result = SweepResult(
        grid=grid,
        metric=metric,
        mode=mode,
        rows=rows,
        wall_time_s=wall,
        trial_train_s=sum(r["train_s"] or 0 for r in rows),
        trial_total_s=sum((r["train_s"] or 0) + (r["startup_s"] or 0) for r in rows),
        path=path,
        keys=tuple(space),
    )
    plot = write_plot(result, os.path.join(path, "sweep.png"))
    best = write_best_experiment(result, experiment, params, os.path.join(path, "best.yaml"))
    return dataclasses.replace(result, plot_path=plot, best_experiment_path=best)


__all__: Sequence[str] = ("SweepResult", "sweep")

"""The public entry points: :func:`fit` and :func:`plan`."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raytf._internal.cluster import ClusterInfo, bundles_fit, cluster_from_ray_nodes
from raytf._internal.job import Job, check_batch_split
from raytf._internal.resolve import LayoutRequest
from raytf.callbacks import Callback, ProgressLogger
from raytf.config import FailurePolicy, Timeouts
from raytf.errors import ConfigError, PlacementError
from raytf.layouts import Layout
from raytf.result import FitResult


@dataclass(frozen=True)
class Plan:
    """The layout raytf would run, why, and the Ray resources it reserves."""

    layout: Layout
    explanation: str
    cluster: ClusterInfo

    @property
    def bundles(self) -> list[dict[str, float]]:
        return self.layout.bundles()

    def __str__(self) -> str:
        return (
            f"layout:    {self.layout.describe()}\n"
            f"why:       {self.explanation}\n"
            f"resources: {self.bundles} (one bundle per actor)\n"
            f"cluster:   {self.cluster.describe()}"
        )


#: How long to wait for a cluster's GCS port to answer before calling it unreachable.
PROBE_TIMEOUT_S = 10.0


def _probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Fail fast when no Ray cluster answers at ``address``: ray.init retries for minutes."""
    if address.startswith("ray://"):
        return  # Ray Client has its own connection timeout
    target = address
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address_or_die

        try:
            target = canonicalize_bootstrap_address_or_die("auto")
        except ConnectionError as exc:
            raise ConfigError(
                f"address='auto' but no running Ray cluster was found on this machine ({exc}). "
                "Start one with `ray start --head` or `ray up cluster.yaml`, or drop --address "
                "to train on a private local Ray."
            ) from None
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(
            f"Ray address {address!r} is not 'auto', 'host:port' or 'ray://host:port'."
        )
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConfigError(
            f"No Ray cluster answers at {target} ({exc}; waited up to {timeout:g}s). Start one "
            "(`ray start --head`, `ray up cluster.yaml`), or fix --address, RAYTF_ADDRESS "
            "or RAY_ADDRESS."
        ) from None


def cluster_address(address: str | None = None) -> str | None:
    """The Ray cluster raytf joins, by one rule for the API and the CLI: ``address`` (or
    ``--address``) if given, else ``RAYTF_ADDRESS``, else ``RAY_ADDRESS`` (which Ray sets in
    jobs), else None: a private local Ray started in this process."""
    for value in (address, os.environ.get("RAYTF_ADDRESS"), os.environ.get("RAY_ADDRESS")):
        if value:
            break
    else:
        return None
    if value.startswith(("http://", "https://")):
        source = (
            "address="
            if value == address
            else "RAYTF_ADDRESS"
            if value == os.environ.get("RAYTF_ADDRESS")
            else "RAY_ADDRESS"
        )
        raise ConfigError(
            f"{source} is {value!r}, the dashboard's job-submission address, not a Ray "
            "cluster address. To train on that cluster, submit the run as a job: `ray job "
            f"submit --address {value} -- raytf run EXPERIMENT` (inside the job RAY_ADDRESS names "
            "the cluster); or pass the cluster's address (host:6379, or 'auto' on one of its "
            "nodes); or unset it to train on a private local Ray."
        )
    return value


def connect(address: str | None = None) -> None:
    """Join the Ray cluster :func:`cluster_address` names, or start a private local one. A
    Ray this process already started (``ray.init()``) is used as it is."""
    import ray

    if ray.is_initialized():
        return
    target = cluster_address(address)
    if target in (None, "local"):
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
    else:
        _probe(target)
        ray.init(address=target, logging_level=logging.WARNING)


def current_cluster() -> ClusterInfo:
    import ray

    return cluster_from_ray_nodes(ray.nodes())


def _cpu_knobs(layout: Layout) -> str:
    """The layout's CPU-reservation options, offered as a fix when bundles do not fit."""
    import dataclasses

    knobs = [f.name for f in dataclasses.fields(layout) if f.name.startswith("cpus_per_")]
    if not knobs:
        return ""
    return f", or reserve less CPU per actor ({', '.join(f'{k}=0.5' for k in knobs)})"


def plan(
    layout: str | Layout = "auto",
    replicas: int | None = None,
    use_gpu: bool | None = None,
    cluster: ClusterInfo | Sequence[tuple[float, float]] | None = None,
    address: str | None = None,
    stragglers: bool = False,
    preemptible: bool = False,
) -> Plan:
    """What :func:`fit` would run on ``cluster`` (default: the connected Ray cluster), and why.

    ``cluster`` may be ``[(cpus, gpus), ...]``, one pair per node, to plan for a cluster you
    do not have. ``stragglers`` / ``preemptible`` tell the auto rule that some workers are
    slower, or may vanish; across nodes it then picks a parameter-server layout.

    Raises :class:`PlacementError` if the layout can never be placed there.
    """
    request = LayoutRequest(
        layout, replicas=replicas, use_gpu=use_gpu, stragglers=stragglers, preemptible=preemptible
    )
    return plan_request(request, cluster, address)


def plan_request(
    request: LayoutRequest,
    cluster: ClusterInfo | Sequence[tuple[float, float]] | None = None,
    address: str | None = None,
) -> Plan:
    """:func:`plan` for a request already made (experiment files, CLI flags, sweep trials)."""
    if cluster is None:
        connect(address)
        cluster = current_cluster()
    elif not isinstance(cluster, ClusterInfo):
        cluster = ClusterInfo.from_counts(*cluster)
    chosen, explanation = request.resolve(cluster)
    if not bundles_fit(chosen.bundles(), cluster):
        raise PlacementError(
            f"{chosen.describe()} needs {chosen.bundles()} but the cluster can never hold "
            f"them ({cluster.describe()}). Ask for fewer replicas or devices, or add nodes"
            f"{_cpu_knobs(chosen)}."
        )
    return Plan(chosen, explanation, cluster)


def trial_resources(
    layout: str | Layout = "auto",
    replicas: int | None = None,
    use_gpu: bool | None = None,
    *,
    cluster: ClusterInfo | Sequence[tuple[float, float]] | None = None,
    address: str | None = None,
    stragglers: bool = False,
    preemptible: bool = False,
) -> Any:
    """The Ray Tune resources for a trial that calls :func:`fit` with these arguments.

    >>> tune.Tuner(tune.with_resources(train, raytf.trial_resources(layout="all-reduce",
    ...                                                             replicas=4)), ...)

    A ``tune.PlacementGroupFactory`` with an empty bundle for the trial itself and one bundle
    per actor of the layout :func:`plan` picks; raytf's actors then take their own bundles.
    Pass a function of the trial's config to ``tune.with_resources`` when trials differ.
    Actors this driver keeps warm (:func:`keep_warm`) are released here: the trials are
    about to need their resources.
    """
    from raytf._internal.runtime.pool import POOL

    POOL.clear()
    chosen = plan(
        layout,
        replicas=replicas,
        use_gpu=use_gpu,
        cluster=cluster,
        address=address,
        stragglers=stragglers,
        preemptible=preemptible,
    )
    return placement_factory(chosen)


def keep_warm(idle_s: float) -> None:
    """How long a finished run's actors stay warm for the next run on the same resources.

    When a run ends well, raytf starts fresh actors (TensorFlow imported, nothing else) on
    the resources it held and keeps them ``idle_s`` seconds: the next :func:`fit` with the
    same layout starts training without reserving or importing again. No process serves two
    runs. Default 60 s (or the ``RAYTF_KEEP_WARM_S`` environment variable); ``0`` turns it
    off and releases what is kept now.
    """
    from raytf._internal.runtime.pool import MAX_IDLE_S, POOL

    number = isinstance(idle_s, (int, float)) and not isinstance(idle_s, bool)
    if not number or not 0 <= idle_s < MAX_IDLE_S:
        raise ConfigError(
            f"keep_warm takes seconds >= 0 (and below {MAX_IDLE_S:g}), received {idle_s!r}; "
            "e.g. raytf.keep_warm(60), or raytf.keep_warm(0) to turn warm actors off."
        )
    POOL.idle_s = float(idle_s)
    if idle_s == 0:
        POOL.clear()


def placement_factory(chosen: Plan) -> Any:
    """Tune's resources for one trial running ``chosen``: an empty bundle for the trial
    itself (Tune drops it from the group), then one per actor."""
    from ray import tune

    return tune.PlacementGroupFactory(
        [{}, *chosen.bundles], strategy=chosen.layout.placement_strategy
    )


def check_elastic(policy: FailurePolicy, layout: Layout) -> None:
    """An elastic policy needs a layout that can change its worker count, and room to shrink."""
    if layout.resized(layout.num_workers) is None:
        raise ConfigError(
            f"FailurePolicy(min_workers={policy.min_workers}) makes the job elastic, but the "
            f"layout is {layout.describe()}, which cannot change its worker count. Pass "
            "layout='all-reduce' (or raytf.AllReduce(...)), or drop min_workers."
        )
    if policy.min_workers > layout.num_workers:
        raise ConfigError(
            f"FailurePolicy(min_workers={policy.min_workers}) is more than the layout's "
            f"{layout.num_workers} worker(s); pass min_workers between 1 and "
            f"{layout.num_workers}."
        )


def fit(
    model: Callable[[], Any],
    data: Any,
    *,
    global_batch_size: int,
    epochs: int = 1,
    layout: str | Layout = "auto",
    replicas: int | None = None,
    use_gpu: bool | None = None,
    validation_data: Any = None,
    steps_per_epoch: int | None = None,
    validation_steps: int | None = None,
    loss: Any = None,
    optimizer: Any = None,
    metrics: Sequence[Any] = (),
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 1,
    resume: bool = False,
    keep_checkpoints: int = 3,
    callbacks: Sequence[Any] = (),
    verbose: bool = True,
    seed: int | None = 0,
    steps_per_execution: int | str = "auto",
    timeouts: Timeouts | None = None,
    failures: FailurePolicy | None = None,
    address: str | None = None,
    stragglers: bool = False,
    preemptible: bool = False,
    runtime_env: dict[str, Any] | None = None,
    feature_columns: str | Sequence[str] | None = None,
    label_columns: str | Sequence[str] | None = None,
    sample_weight_column: str | None = None,
    class_weight: dict[int, float] | None = None,
    validation_freq: int = 1,
    initial_epoch: int = 0,
    shuffle: bool = True,
) -> FitResult:
    """Train a Keras 3 model on Ray with the layout that suits the cluster.

    ``model`` builds (and usually compiles) a ``keras.Model``; raytf calls it inside each
    worker's strategy scope. ``data`` (and ``validation_data``) is a function that takes an
    :class:`~raytf.InputContext` and returns this worker's unbatched ``tf.data.Dataset`` of
    ``(features, labels)``; or NumPy arrays ``(x, y[, sample_weight])`` as ``model.fit``
    takes them (``shuffle``, as in Keras, reshuffles each worker's rows every epoch); or a
    ``ray.data.Dataset`` or Parquet/TFRecord files, with ``feature_columns=`` and
    ``label_columns=`` naming the columns. ``layout="auto"`` puts
    the replicas in one graph when they fit on one node and uses all-reduce across nodes
    otherwise, or parameter servers when they pay (``stragglers=True``, ``preemptible=True``,
    spare CPU-only nodes); ``result.explanation`` says why. ``failures=FailurePolicy(...)``
    lets the run survive dead or preempted actors by restarting from its newest checkpoint.
    ``runtime_env`` (Ray's: ``working_dir``, ``py_modules``, ``pip``, ``env_vars``) reaches
    every actor raytf starts, e.g. to ship the module your model and data functions live in.

    ``callbacks`` takes Keras callbacks (run in the workers: writers on the chief, the rest
    on every worker with the global logs, decisions made global; see docs/keras.md) and
    raytf callbacks (run here, in the driver). ``class_weight``, ``validation_freq`` and
    ``initial_epoch`` mean what they mean in ``model.fit``; a model's own ``train_step`` and
    ``test_step`` run in every layout that can run them, and are refused by name elsewhere.
    """
    started = time.time()
    from raytf._internal import inputs
    from raytf._internal.runtime import runtime_env as renv
    from raytf._internal.worker import keras_callbacks

    renv.check(runtime_env)
    driver_hooks, keras_hooks = [], []
    for cb in callbacks:
        if isinstance(cb, Callback):
            driver_hooks.append(cb)
        elif keras_callbacks.is_keras_callback(cb):
            keras_hooks.append(cb)
        else:
            raise ConfigError(
                f"callbacks must be keras.callbacks.Callback or raytf.Callback instances, "
                f"received {type(cb).__name__} ({cb!r:.80})."
            )
    keras_callbacks.check(keras_hooks)
    columns = (feature_columns, label_columns, sample_weight_column)
    data = inputs.as_data_fn(data, "data", *columns)
    if isinstance(data, inputs.ArrayInput):  # Keras shuffles arrays every epoch by default
        data = dataclasses.replace(data, shuffle=shuffle)
    validation_data = inputs.as_data_fn(validation_data, "validation_data", *columns)
    job = Job(
        model_fn=model,
        data_fn=data,
        global_batch_size=global_batch_size,
        epochs=epochs,
        validation_fn=validation_data,
        steps_per_epoch=steps_per_epoch,
        validation_steps=validation_steps,
        loss=loss,
        optimizer=optimizer,
        metrics=tuple(metrics),
        steps_per_execution=steps_per_execution,
        seed=seed,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        resume=resume,
        keep_checkpoints=keep_checkpoints,
        keras_callbacks=tuple(keras_hooks),
        class_weight=class_weight,
        validation_freq=validation_freq,
        initial_epoch=initial_epoch,
    )
    timeouts = timeouts or Timeouts()
    if not isinstance(timeouts, Timeouts):
        raise ConfigError(f"timeouts must be a raytf.Timeouts, received {timeouts!r}.")
    failures = failures or FailurePolicy()
    if not isinstance(failures, FailurePolicy):
        raise ConfigError(
            f"failures must be a raytf.FailurePolicy, received {failures!r}; for example "
            "failures=raytf.FailurePolicy(max_failures=3, checkpoint_every_steps=100)."
        )
    request = LayoutRequest(  # a typo fails here, before Ray starts
        layout, replicas=replicas, use_gpu=use_gpu, stragglers=stragglers, preemptible=preemptible
    )
    chosen = plan_request(request, address=address)
    check_batch_split(global_batch_size, chosen.layout.num_replicas)
    workers = chosen.layout.num_workers
    for name, what in (("data_fn", "data"), ("validation_fn", "validation_data")):
        inputs.check_for_layout(getattr(job, name), what, chosen.layout, failures)
    for name, what in (("data_fn", "data"), ("validation_fn", "validation_data")):
        # Once, before any actor starts: training in equal shares, validation every row.
        shipped = inputs.ship(getattr(job, name), workers, equal=name == "data_fn")
        if name == "data_fn":
            inputs.check_rows(shipped, what, chosen.layout, global_batch_size)
        job = dataclasses.replace(job, **{name: shipped})
    runtime_env = renv.for_actors(runtime_env)  # local paths uploaded once, as ray.init would
    if (
        failures.max_failures
        and not checkpoint_dir
        and len(chosen.cluster.nodes) > 1
        and len(chosen.layout.bundles()) > 1
    ):
        raise ConfigError(
            f"failures=FailurePolicy(max_failures={failures.max_failures}) on a "
            f"{len(chosen.cluster.nodes)}-node cluster needs checkpoint_dir= on storage every "
            "node can read (NFS, a mounted bucket): a recovered worker on another node must "
            "find the checkpoint to restore."
        )

    if failures.elastic:
        check_elastic(failures, chosen.layout)

    from raytf._internal import tune_trial
    from raytf._internal.runtime.controller import Controller

    trial = None
    if tune_trial.in_trial():  # report epochs to Tune, checkpoint for it, resume from it
        trial = tune_trial.setup(
            checkpoint_dir, resume, keep_checkpoints, shared=len(chosen.cluster.nodes) > 1
        )
        job = dataclasses.replace(
            job,
            checkpoint_dir=trial.checkpoint_dir,
            resume=trial.resume,
            keep_checkpoints=trial.keep,
            finished_ok=trial.restored_from_tune,
        )
        reporters = [cb for cb in driver_hooks if isinstance(cb, tune_trial.TuneReporter)]
        if not reporters:
            reporters = [tune_trial.TuneReporter()]
            driver_hooks.append(reporters[0])
        for reporter in reporters:
            reporter.directory = trial.checkpoint_dir
            reporter.carried = trial.carried
    hooks = [ProgressLogger(), *driver_hooks] if verbose else driver_hooks
    try:
        result = Controller(
            chosen.layout,
            job,
            timeouts,
            chosen.explanation,
            hooks,
            failures=failures,
            model_dir=checkpoint_dir,
            started=started,
            runtime_env=runtime_env,
        ).run()
    finally:
        if trial is not None:
            trial.cleanup()
    if trial is not None and trial.temporary and result.checkpoint:
        result = dataclasses.replace(result, checkpoint=None)  # removed with the trial's scratch
    return result

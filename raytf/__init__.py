"""raytf: distributed TensorFlow on Ray, with the layout chosen for you.

>>> result = raytf.fit(model=build_model, data=make_dataset, global_batch_size=256, epochs=5)
>>> print(result.layout, result.explanation, result.history, result.throughput)
"""

from raytf.api import Plan, fit, keep_warm, plan, trial_resources
from raytf.callbacks import Callback, ProgressLogger, RunInfo
from raytf.config import FailurePolicy, Timeouts
from raytf.data import InputContext
from raytf.errors import (
    ConfigError,
    PlacementError,
    Preempted,
    RaytfError,
    StartupTimeoutError,
    WorkerError,
)
from raytf.layouts import AllReduce, InGraph, Layout, ParameterServer, layout_names
from raytf.records import FailureRecord, ResizeRecord, ServerRow, WorkerRow
from raytf.result import FitResult
from raytf.scoring import evaluate, predict
from raytf.sweep import SweepResult, sweep

__version__ = "0.2.0"

__all__ = [
    "AllReduce",
    "Callback",
    "ConfigError",
    "FailurePolicy",
    "FailureRecord",
    "FitResult",
    "InGraph",
    "InputContext",
    "Layout",
    "ParameterServer",
    "PlacementError",
    "Plan",
    "Preempted",
    "ProgressLogger",
    "RaytfError",
    "ResizeRecord",
    "RunInfo",
    "ServerRow",
    "StartupTimeoutError",
    "SweepResult",
    "Timeouts",
    "WorkerError",
    "WorkerRow",
    "evaluate",
    "fit",
    "keep_warm",
    "layout_names",
    "plan",
    "predict",
    "sweep",
    "trial_resources",
]

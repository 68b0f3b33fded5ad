"""Layouts. Every module in this package registers its own names when imported."""

from __future__ import annotations

import importlib
import pkgutil

from raytf.layouts._registry import (
    layout_names,
    layout_option_names,
    register,
    resolve,
)
from raytf.layouts.base import Layout

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_") and _mod.name != "base":
        importlib.import_module(f"{__name__}.{_mod.name}")

from raytf.layouts.all_reduce import AllReduce  # noqa: E402
from raytf.layouts.in_graph import InGraph  # noqa: E402
from raytf.layouts.parameter_server import ParameterServer  # noqa: E402

__all__ = [
    "AllReduce",
    "InGraph",
    "Layout",
    "ParameterServer",
    "layout_names",
    "layout_option_names",
    "register",
    "resolve",
]

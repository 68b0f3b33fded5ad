"""Name -> layout registry. Each layout module registers its own names at import."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raytf.errors import ConfigError
from raytf.layouts.base import Layout

_REGISTRY: dict[str, tuple[type[Layout], dict[str, Any]]] = {}


def register(name: str, **defaults: Any) -> Callable[[type[Layout]], type[Layout]]:
    """Register ``cls`` under ``name``; ``defaults`` are options the name implies."""

    def wrap(cls: type[Layout]) -> type[Layout]:
        if name in _REGISTRY and _REGISTRY[name][0] is not cls:
            raise ConfigError(f"Layout name {name!r} is registered twice.")
        _REGISTRY[name] = (cls, dict(defaults))
        return cls

    return wrap


def layout_names() -> list[str]:
    return sorted(_REGISTRY)


def layout_option_names() -> frozenset[str]:
    """Every option a registered layout takes (its dataclass fields), minus ``use_gpu``, which
    is a run-level setting."""
    import dataclasses

    names = {f.name for cls, _ in _REGISTRY.values() for f in dataclasses.fields(cls)}
    return frozenset(names - {"use_gpu"})


def resolve(name: str) -> tuple[type[Layout], dict[str, Any]]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"Unknown layout {name!r}. Choose one of {['auto', *layout_names()]}, "
            "or pass a layout object such as raytf.InGraph(devices=2)."
        ) from None

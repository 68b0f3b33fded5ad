"""The layout base class: how many actors, with which resources, driving which strategy."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from raytf._internal.checks import positive_int
from raytf.errors import ConfigError

if TYPE_CHECKING:
    from raytf._internal.runtime.backend import Backend
    from raytf._internal.spec import StrategySpec


def check_devices(owner: str, name: str, value: Any, use_gpu: bool = False) -> None:
    """A device count: a positive integer, and whole GPUs."""
    if use_gpu and isinstance(value, float) and 0 < value < 1:
        raise ConfigError(
            f"{owner}: {name}={value!r} asks for a fraction of a GPU. raytf gives TensorFlow "
            "whole GPUs: TensorFlow maps a GPU's memory per process and cannot share one "
            f"safely between actors. Use {name}=1 or more."
        )
    positive_int(name, value, owner=owner)


def refuse_engine(owner: str, value: Any, renamed_to: str, choices: str) -> None:
    """``engine=`` meant three things before 0.2; each layout now says which it means."""
    if value is not None:
        raise ConfigError(
            f"{owner}: engine={value!r} was renamed: pass {renamed_to}={value!r} "
            f"({choices}). In YAML and on the command line it is '{renamed_to}' too."
        )


@dataclass(frozen=True)
class Layout(ABC):
    """A way to lay a training job out on Ray actors.

    A layout is a pure description (its actors' bundles, its shape, its TensorFlow specs);
    how it runs is the backend it names (:meth:`backend_cls`), driven by raytf's one generic
    controller. Subclasses are frozen dataclasses registered under one or more names with
    :func:`raytf.layouts.register`.
    """

    name: ClassVar[str]
    #: Actors need each other's addresses before TensorFlow starts (TF_CONFIG).
    needs_addresses: ClassVar[bool] = False
    #: Ray placement-group strategy for the bundles.
    placement_strategy: ClassVar[str] = "PACK"

    @property
    @abstractmethod
    def num_workers(self) -> int: ...

    @property
    @abstractmethod
    def devices_per_worker(self) -> int: ...

    @property
    def num_replicas(self) -> int:
        return self.num_workers * self.devices_per_worker

    @abstractmethod
    def bundles(self) -> list[dict[str, float]]:
        """Ray resource bundles, one per actor, in worker order (a placement group's input)."""

    @abstractmethod
    def strategy_specs(self, addresses: list[str] | None) -> list[StrategySpec]:
        """One spec per actor; ``addresses`` are the ``host:port`` the actors bound."""

    @classmethod
    @abstractmethod
    def for_replicas(cls, replicas: int, use_gpu: bool, **options: Any) -> Layout:
        """The layout that runs ``replicas`` replicas, for ``layout="name", replicas=N``."""

    def resized(self, workers: int) -> Layout | None:
        """This layout with ``workers`` workers, for elastic runs; None if it cannot resize."""
        return None

    @abstractmethod
    def backend_cls(self) -> type[Backend]:
        """How this layout runs: the backend the controller drives (imported lazily)."""

    def describe(self) -> str:
        return f"{self.name}: {self.num_workers} worker(s) x {self.devices_per_worker} device(s)"

"""Reserving a layout's bundles as a Ray placement group, and probing for returned resources.

The controller takes a :class:`Placer` so its state machine can be stepped in a unit test
with a fake one; :class:`RayPlacer` is the real thing.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from raytf._internal.cluster import ClusterInfo, bundles_fit
from raytf._internal.runtime.pool import POOL
from raytf.errors import PlacementError
from raytf.layouts.base import Layout

#: A probe for returned resources waits this long.
GROW_PROBE_S = 1.0


class Placer(Protocol):
    def reserve(self, layout: Layout, timeout_s: float) -> Any: ...
    def release(self, placement: Any) -> None: ...
    def has_free(self, bundles: list[dict[str, float]]) -> bool: ...
    def probe(self, bundles: list[dict[str, float]], strategy: str) -> bool: ...


def check_caller_group(layout: Layout, reserved: list[dict[str, float]]) -> None:
    """Inside a caller's placement group (a Tune trial) raytf's actors land in its bundles:
    if those can never hold the layout's, say so now, rather than leave actors pending."""
    room = ClusterInfo.from_counts(*((b.get("CPU", 0.0), b.get("GPU", 0.0)) for b in reserved))
    if bundles_fit(layout.bundles(), room):
        return
    raise PlacementError(
        f"raytf.fit runs inside a placement group (a Ray Tune trial) that reserved {reserved}, "
        f"but {layout.describe()} needs {layout.bundles()}, one bundle per actor. Reserve "
        f"them for the trial: tune.with_resources(trainable, "
        f"raytf.trial_resources(layout=raytf.{layout!r}))."
    )


class RayPlacer:
    """Placement groups on the connected Ray cluster."""

    def reserve(self, layout: Layout, timeout_s: float) -> Any:
        """A placement group for the layout's bundles, or None inside a caller's group (a
        Tune trial), which must be able to hold them."""
        import ray
        from ray.util.placement_group import (
            get_current_placement_group,
            placement_group,
            remove_placement_group,
        )

        caller = get_current_placement_group()
        if caller is not None:
            check_caller_group(layout, caller.bundle_specs)
            return None
        bundles = layout.bundles()
        warm = POOL.take_placement(bundles, layout.placement_strategy)
        if warm is not None:  # the previous run's group, with its actors started (pool.py)
            return warm
        pg = placement_group(bundles, strategy=layout.placement_strategy)
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(pg)
            raise PlacementError(
                f"Could not reserve {bundles} for {layout.describe()} within {timeout_s:g}s: "
                "the cluster has these resources in total, but they are held by other actors "
                "or jobs. Free them, use fewer replicas, or raise Timeouts(placement_s=...)."
            )
        return pg

    def release(self, placement: Any) -> None:
        from ray.util.placement_group import remove_placement_group

        if placement is not None and not POOL.keeps(placement):
            POOL.forget(placement)
            remove_placement_group(placement)

    def has_free(self, bundles: list[dict[str, float]]) -> bool:
        """A cheap look: are the free resources at least what ``bundles`` add up to?"""
        import ray

        free = ray.available_resources()
        need: Counter[str] = Counter()
        for bundle in bundles:
            need.update(bundle)
        return all(free.get(k, 0.0) >= v for k, v in need.items())

    def probe(self, bundles: list[dict[str, float]], strategy: str) -> bool:
        """Can ``bundles`` be placed now? A probe reservation, released at once."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        probe = placement_group(bundles, strategy=strategy)
        try:
            ready, _ = ray.wait([probe.ready()], timeout=GROW_PROBE_S)
        finally:
            remove_placement_group(probe)
        return bool(ready)

"""Warm actors, one at a time: what identifies one, how it starts on its bundle, whether it
is still alive, and a run's lease on a kept group's actors. The pool (pool.py) keeps them."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: What identifies a warm actor: (bundle index in its group, class, name, constructor args,
#: runtime_env as JSON, the bundle's resources).
Spec = tuple[int, type, str, tuple, str, tuple]


def env_key(runtime_env: dict[str, Any] | None) -> str:
    return json.dumps(runtime_env or {}, sort_keys=True, default=str)


def start_actor(
    cls: type,
    name: str,
    args: tuple,
    bundle: dict[str, float],
    placement: Any,
    index: int,
    runtime_env: dict[str, Any] | None,
) -> Any:
    """``cls`` as a Ray actor on bundle ``index`` of ``placement`` (None: Ray places it)."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = None
    if placement is not None:
        strategy = PlacementGroupSchedulingStrategy(
            placement,
            placement_group_bundle_index=index,
            placement_group_capture_child_tasks=True,
        )
    return (
        ray.remote(cls)
        .options(
            num_cpus=bundle.get("CPU", 0),
            num_gpus=bundle.get("GPU", 0),
            max_restarts=0,
            scheduling_strategy=strategy,
            runtime_env=runtime_env,
        )
        .remote(name, *args)
    )


@dataclass(eq=False)
class Warm:
    """One kept placement group and the fresh actors waiting on its bundles."""

    placement: Any
    bundles: tuple[tuple[tuple[str, float], ...], ...]
    strategy: str
    owned: bool  # reserved by raytf (released at expiry), or a Tune trial's
    spare: bool = False  # a running run's spares (no timer; see the module docstring)
    actors: dict[int, tuple[Spec, Any, Any]] = field(
        default_factory=dict
    )  # index: spec, actor, ready
    timer: threading.Timer | None = None


def frozen(bundles: Sequence[dict[str, float]]) -> tuple[tuple[tuple[str, float], ...], ...]:
    return tuple(tuple(sorted((k, float(v)) for k, v in b.items() if v)) for b in bundles)


class Lease:
    """A run's claim on a warm group's actors, until its spawning is over."""

    def __init__(self, warm: Warm | None, only: int | None = None) -> None:
        self.warm = warm
        # Asked now, all at once: an actor that died while idle answers with its death.
        self.pings = {}
        if warm is not None:
            self.pings = {
                i: actor.__ray_ready__.remote()
                for i, (_, actor) in warm.actors.items()
                if only is None or i == only
            }

    def take(self, spec: Spec) -> Any:
        """The warm actor for ``spec``, or None (then nothing holds its bundle any more)."""
        warm = self.warm
        if warm is None:
            return None
        found = warm.actors.pop(spec[0], None)
        if found is None:
            return None
        parked, actor = found
        if parked != spec or not alive(self.pings.get(spec[0])):
            kill(actor)  # another kind of member, or it died idle
            return None
        return actor

    def close(self) -> None:
        """Spawning is over: warm actors no member took are stopped (they hold resources)."""
        if self.warm is not None:
            for _, actor in self.warm.actors.values():
                kill(actor)
            self.warm.actors.clear()
            self.warm = None


#: How long a lease waits for a warm actor's answer; one still starting counts as alive.
PING_S = 0.5


def alive(ping: Any) -> bool:
    """False if the actor is known to have died; a starting actor counts as alive."""
    import ray

    if ping is None:
        return True
    done, _ = ray.wait([ping], timeout=PING_S)
    if not done:
        return True
    try:
        ray.get(done[0])
    except Exception:
        return False
    return True


def session() -> Any:
    """This process's Ray session (None without one): a new ``ray.init`` makes a new one."""
    import ray

    if not ray.is_initialized():
        return None
    try:
        return ray._private.worker.global_worker.node.session_name
    except AttributeError:  # no node object in this process: the next best key
        context = ray.get_runtime_context()
        return (context.gcs_address, context.get_job_id())


def kill(actor: Any) -> None:
    """Stop ``actor``; already gone, or Ray shut down meanwhile, is fine."""
    import ray

    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)

"""Warm actors: the next run on the same bundles starts without importing TensorFlow again.

A new actor pays for a process and ``import tensorflow`` (3-4 s here) before it can build a
model; a notebook's second ``fit``, each trial of a sweep and a rerun pay it again. So when a
run ends well, its actors are stopped as always (no process outlives its run: nothing of one
run's TensorFlow state can reach the next) and a fresh actor of the same class, name and
bundle is started in each one's place, on the placement group the run held, which is kept.
The next run whose layout needs the same bundles takes the group and these actors instead of
reserving and starting its own; a run needing other bundles releases them first. Unused for
``idle_s`` they are stopped and the resources go back to Ray, and at once when anything else
asks Ray for resources it cannot have (a watcher reads the cluster's pending demand): a warm
group never keeps other work waiting.

Inside a Tune trial the group is the trial's: the actors wait in it for the next trial that
Tune runs in the same trial actor (``reuse_actors``, which ``raytf.sweep`` turns on).

Spares: while a run trains, one fresh actor per member on a CPU-only bundle waits beside
it, asking for no resources of its own (the bundle's are the member's until it dies or the
run ends, and then free for its successor). A recovery, which restarts every member, takes
them instead of importing TensorFlow again (new spares start once it trains); a run that
ends well hands them on as the warm actors, already warm when the next run comes at once (a
sweep's next trial). They are started for runs that may recover or whose group will be kept.
A GPU bundle has none: Ray gives a GPU (and ``CUDA_VISIBLE_DEVICES``) only to an actor that
asks for it when it is created, so its warm actor starts when the run ends, and a recovered
GPU member starts cold.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from raytf._internal.runtime.warm import (
    Lease,
    Spec,
    Warm,
    frozen,
    kill,
    start_actor,
)
from raytf._internal.runtime.warm import session as current_session

logger = logging.getLogger("raytf")

#: Seconds a warm group waits for its next run, unless raytf.keep_warm() or the environment
#: variable says otherwise.
DEFAULT_IDLE_S = 60.0
ENV = "RAYTF_KEEP_WARM_S"
#: How often the watcher looks for work waiting on resources that warm groups hold.
WATCH_S = 0.5
#: Above this, a timer cannot wait (threading's limit): "keep for ever" is not offered.
MAX_IDLE_S = 1e6


class WarmPool:
    """This driver's warm groups; see the module docstring. Thread-safe (timers expire)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._warm: list[Warm] = []  # parked: waiting for a run (or a run's spares)
        self._taken: dict[Any, Warm] = {}  # placement id: taken by a run, not yet leased
        self._session: Any = None
        self._watcher: threading.Thread | None = None
        self.idle_s: float | None = None  # None: the environment variable, else the default

    # ------------------------------------------------------------------ policy
    def idle_seconds(self) -> float:
        if self.idle_s is not None:
            return self.idle_s
        raw = os.environ.get(ENV)
        try:
            value = float(raw) if raw else DEFAULT_IDLE_S
        except ValueError:
            return DEFAULT_IDLE_S
        return value if 0 <= value < MAX_IDLE_S else DEFAULT_IDLE_S

    def _check_session(self) -> None:
        """Warm groups belong to one Ray session: after a shutdown they are gone."""
        session = current_session()
        if session != self._session:
            for warm in self._warm:
                if warm.timer is not None:
                    warm.timer.cancel()
            self._warm, self._taken = [], {}
            self._session = session

    # ------------------------------------------------------------------ runs
    def take_placement(self, bundles: Sequence[dict[str, float]], strategy: str) -> Any:
        """A kept group of raytf's own with exactly these bundles, or None, in which case
        every kept group of raytf's own is released (the new reservation needs the room)."""
        with self._lock:
            self._check_session()
            wanted = frozen(bundles)
            for warm in self._parked(owned=True):
                if warm.bundles == wanted and warm.strategy == strategy:
                    self._hold(warm)
                    self._warm.remove(warm)  # no timer can expire it from here on
                    self._taken[warm.placement.id] = warm
                    return warm.placement
            for warm in self._parked(owned=True):
                self._expire(warm)
            return None

    def lease(self, placement: Any) -> Lease:
        """The warm actors on ``placement`` (a group just taken, or a Tune trial's)."""
        if placement is None:
            return Lease(None)
        with self._lock:
            self._check_session()
            warm = self._taken.pop(placement.id, None)
            if warm is None:
                for parked in self._parked():
                    if parked.placement == placement:
                        warm = parked
                        self._hold(parked)
                        self._warm.remove(parked)
                        break
            return Lease(warm)

    def park(
        self,
        placement: Any,
        owned: bool,
        bundles: Sequence[dict[str, float]],
        strategy: str,
        members: Sequence[tuple[Spec, dict[str, float]]],
        runtime_env: dict[str, Any] | None,
    ) -> bool:
        """Keep ``placement`` for the next run, with a fresh actor for each member on its
        bundle: the run's spare for it (started while it trained, so already warm), else a
        new one. False (and nothing kept) when warm actors are turned off."""
        if not self.parking(owned) or placement is None:
            self.drop_spares(placement)
            return False
        with self._lock:
            spares: dict[int, tuple[Spec, Any]] = {}
            for entry in [w for w in self._parked(spare=True) if w.placement == placement]:
                self._warm.remove(entry)
                spares.update(entry.actors)
        warm = Warm(placement, frozen(bundles), strategy, owned)
        try:
            for spec, bundle in members:
                index, cls, name, args = spec[:4]
                spare = spares.pop(index, None)
                if spare is not None and spare[0] == spec:
                    warm.actors[index] = spare
                    continue
                actor = start_actor(cls, name, args, bundle, placement, index, runtime_env)
                warm.actors[index] = (spec, actor)
            for _, actor in spares.values():  # of members this run no longer has
                self.kill(actor)
        except Exception:  # the run is done: a failure here only means nothing is kept
            logger.warning("raytf: could not start warm actors; releasing.", exc_info=True)
            for _, actor in warm.actors.values():
                self.kill(actor)
            return False
        with self._lock:
            self._check_session()
            self._start_timer(warm, self.idle_seconds())
            self._warm.append(warm)
            if owned:
                self._watch()
        return True

    def parking(self, owned: bool) -> bool:
        """Will a run that ends well on a group (``owned`` or a Tune trial's) keep it warm?"""
        if self.idle_seconds() <= 0:
            return False
        # A Tune trial's group outlives the trial only when Tune reuses the trial's actor
        # (raytf.sweep does, and says so here): otherwise the start would be waste.
        return owned or self.idle_s is not None or ENV in os.environ

    def add_spares(
        self,
        placement: Any,
        members: Sequence[tuple[Spec, dict[str, float]]],
        runtime_env: dict[str, Any] | None,
    ) -> int:
        """Spares for the members on CPU-only bundles of ``placement``, unless it has some;
        how many were started."""
        if placement is None:
            return 0
        with self._lock:
            self._check_session()
            if any(w.placement == placement for w in self._parked(spare=True)):
                return 0
        warm = Warm(placement, (), "", owned=False, spare=True)
        try:
            for spec, bundle in members:
                if bundle.get("GPU"):
                    continue
                index, cls, name, args = spec[:4]
                # Ray sets OMP_NUM_THREADS from the CPUs an actor asks for (1 for none): the
                # member's count, as its replacement would have had.
                threads = str(max(1, math.floor(bundle.get("CPU", 1))))
                env = dict(runtime_env or {})
                env["env_vars"] = {"OMP_NUM_THREADS": threads, **env.get("env_vars", {})}
                actor = start_actor(cls, name, args, {}, placement, index, env)
                warm.actors[index] = (spec, actor)
        except Exception:  # spares only save time: the run goes on without
            logger.warning("raytf: could not start spare actors.", exc_info=True)
            for _, actor in warm.actors.values():
                self.kill(actor)
            return 0
        if not warm.actors:
            return 0
        with self._lock:
            self._warm.append(warm)
        return len(warm.actors)

    def take_spare(self, placement: Any, spec: Spec) -> Any:
        """A live spare for ``spec`` on ``placement``, or None."""
        if placement is None:
            return None
        with self._lock:
            for warm in self._parked(spare=True):
                if warm.placement == placement:
                    actor = Lease(warm, only=spec[0]).take(spec)
                    if not warm.actors:
                        self._warm.remove(warm)
                    return actor
        return None

    def drop_spares(self, placement: Any) -> None:
        """The run on ``placement`` is over: its spares are stopped."""
        if placement is None:
            return
        with self._lock:
            for warm in [w for w in self._parked(spare=True) if w.placement == placement]:
                self._warm.remove(warm)
                for _, actor in warm.actors.values():
                    self.kill(actor)

    def make_room(self, cpus: float) -> None:
        """Ray work of this driver's own (Ray Data reads, scoring actors) needs ``cpus``: if
        warm groups of raytf's own hold them, release these rather than leave it waiting."""
        import ray

        with self._lock:
            self._check_session()
            owned = self._parked(owned=True)
        if owned and ray.available_resources().get("CPU", 0.0) < cpus:
            with self._lock:
                for warm in owned:
                    if warm in self._warm:
                        self._expire(warm)

    def forget(self, placement: Any) -> None:
        """``placement`` is being removed: a taken group's actors that no run leased go."""
        with self._lock:
            warm = self._taken.pop(getattr(placement, "id", None), None)
        if warm is not None:
            for _, actor in warm.actors.values():
                self.kill(actor)

    def keeps(self, placement: Any) -> bool:
        """Is ``placement`` kept warm (so its run must not remove it)?"""
        with self._lock:
            return any(w.placement == placement for w in self._parked())

    def clear(self) -> None:
        """Stop every warm actor and release every kept group (Tune needs the room)."""
        with self._lock:
            self._check_session()
            for warm in self._parked():
                self._expire(warm)

    def actor_ids(self) -> set[str]:
        """Ray ids of the warm actors kept for the next run (not spares)."""
        return self._ids(spare=False)

    def spare_ids(self) -> set[str]:
        """Ray ids of the spares waiting for a running run's recovery."""
        return self._ids(spare=True)

    def __len__(self) -> int:
        """Warm groups kept for the next run."""
        with self._lock:
            return len(self._parked())

    # ------------------------------------------------------------------ helpers
    def _parked(self, owned: bool | None = None, spare: bool = False) -> list[Warm]:
        return [w for w in self._warm if w.spare == spare and (owned is None or w.owned == owned)]

    def _ids(self, spare: bool) -> set[str]:
        with self._lock:
            return {
                actor._actor_id.hex()
                for w in self._parked(spare=spare)
                for _, actor in w.actors.values()
            }

    def _watch(self) -> None:
        """Start the watcher of pending demand, unless one runs (called with the lock)."""
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(target=self._watching, daemon=True)
            self._watcher.start()

    def _watching(self) -> None:
        """While raytf keeps groups of its own, release them as soon as Ray has work it
        cannot place (a task, an actor or a placement group waiting for resources)."""
        try:
            import ray
            from ray.autoscaler.v2.sdk import get_cluster_status

            address = ray.get_runtime_context().gcs_address
        except Exception:  # no status API here: the idle timer alone releases
            return
        session = self._session
        while True:
            time.sleep(WATCH_S)  # a poll of Ray's state, in the background
            with self._lock:
                gone = not ray.is_initialized() or session != current_session()
                if gone or session != self._session or not self._parked(owned=True):
                    return
            try:
                demand = get_cluster_status(address).resource_demands
            except Exception:
                continue
            if demand.placement_group_demand or demand.ray_task_actor_demand:
                with self._lock:
                    if session == self._session:
                        for warm in self._parked(owned=True):
                            self._expire(warm)

    def _start_timer(self, warm: Warm, idle: float) -> None:
        timer = threading.Timer(idle, self._on_timer, args=(warm,))
        timer.daemon = True
        warm.timer = timer
        timer.start()

    def _hold(self, warm: Warm) -> None:
        if warm.timer is not None:
            warm.timer.cancel()
            warm.timer = None

    def _on_timer(self, warm: Warm) -> None:
        timer = threading.current_thread()
        with self._lock:
            # Taken (or re-armed) since this timer fired: not this timer's to expire.
            if warm.timer is timer and warm in self._warm and current_session() == self._session:
                self._expire(warm)

    def _expire(self, warm: Warm) -> None:
        self._hold(warm)
        with contextlib.suppress(ValueError):
            self._warm.remove(warm)
        for _, actor in warm.actors.values():
            self.kill(actor)
        warm.actors.clear()
        if warm.owned:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):  # Ray shut down meanwhile
                remove_placement_group(warm.placement)

    kill = staticmethod(kill)


#: The driver's pool.
POOL = WarmPool()

"""The actors of one attempt, and the one fail-fast wait every call on them goes through.

Members are plain classes made Ray actors here, at spawn, with their bundle's resources, so
the same class runs in a test process without Ray. A backend spawns the members it needs
(workers, servers, TensorFlow tasks) and tags each with a role; the controller never needs
to know which.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup

from raytf._internal.runtime.pool import POOL
from raytf._internal.runtime.warm import Spec, env_key, start_actor
from raytf.errors import ConfigError, Preempted, RaytfError, StartupTimeoutError, WorkerError

#: How long to look for a dead peer behind a surviving peer's error before reporting it.
DEATH_GRACE_S = 2.0

#: Errors that mean an actor or its process went away, not a bug in user code: recoverable.
LOST = frozenset(
    {
        "RayActorError",
        "ActorDiedError",
        "ActorUnavailableError",
        "WorkerCrashedError",
        "NodeDiedError",
        "OwnerDiedError",
        "LocalRayletDiedError",
        # What a surviving TensorFlow peer reports when the other side vanished.
        "UnavailableError",
        "AbortedError",
        "CancelledError",
    }
)

HINTS = {
    "start": "actors did not start (a node too slow to import TensorFlow, or a "
    "model/data function that hangs); raise Timeouts(start_s=...)",
    "peers": "TensorFlow peers did not connect: a peer is missing or the nodes cannot "
    "open TCP connections to each other on ephemeral ports (check firewalls "
    "and security groups); raise Timeouts(peers_s=...) for slow networks",
    "epoch": "an epoch did not finish; raise Timeouts(epoch_s=...) for long epochs",
    "final": "the final model was not saved in time; raise Timeouts(start_s=...)",
    "checkpoint": "a checkpoint was not written in time (slow storage?); raise "
    "Timeouts(start_s=...)",
}


def recoverable(exc: BaseException) -> bool:
    """A lost actor or a preemption: the failure policy may recover. A bug would recur."""
    if isinstance(exc, Preempted):
        return True
    return isinstance(exc, WorkerError) and exc.error_type in LOST


def _missing_module(exc: BaseException) -> ConfigError | None:
    """An actor could not import a module that this driver imports from the user's project
    (not an installed package): the functions raytf shipped need it. A module missing here
    too (a typo, an uninstalled dependency) is the user's own error, reported as it is."""
    import importlib.util
    import sysconfig

    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
    if isinstance(cause, WorkerError):
        if cause.error_type != "ModuleNotFoundError":
            return None
        text = cause.args[0]
    else:
        text = f"{cause!r}"
    found = re.search(r"No module named '([^']+)'", text)
    if found is None:
        return None
    module = found.group(1)
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    origin = (spec.origin or "") if spec else ""
    if spec is None or any(origin.startswith(p) for p in installed):
        return None  # not the driver's own module: the original error says what is missing
    return ConfigError(
        f"raytf's actors cannot import {module!r}, which this program imports from "
        f"{os.path.dirname(origin) or origin!r}: your model, data or loss functions use it, "
        "and Ray's worker processes do not run in your script's directory. Ship it with the "
        f"run: raytf.fit(..., runtime_env={{'py_modules': ['path/to/{top}']}}) or "
        "runtime_env={'working_dir': '.'} (YAML: runtime_env:, CLI: --working-dir .), or "
        f"install it on every node. The actor said: {text.splitlines()[0][:300]}"
    )


def unwrap(exc: BaseException, name: str) -> BaseException:
    """The error a user should see for a failed actor call."""
    missing = _missing_module(exc)
    if missing is not None:
        return missing
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause
        if isinstance(cause, RaytfError):
            return cause
        return WorkerError(
            f"{name} failed: {cause!r}",
            worker=name,
            error_type=type(cause).__name__,
            remote_traceback=str(exc),
        )
    if isinstance(exc, ray.exceptions.RayActorError):
        return WorkerError(
            f"{name} died (its process exited or was killed): {exc}",
            worker=name,
            error_type=type(exc).__name__,
        )
    return exc


def _fits(bundle: dict[str, float], room: dict[str, float]) -> bool:
    return all(room.get(k, 0.0) >= v for k, v in bundle.items() if v)


def _caller_group(bundles: list[dict[str, float]]) -> tuple[PlacementGroup | None, int]:
    """The placement group this process runs in (a Tune trial's), and where the layout's
    bundles sit in it, so each actor takes its own bundle: left to Ray, a CPU-only server
    may take the CPU of a GPU worker's bundle and leave that worker pending. (None, 0) when
    there is none, or its bundles do not hold the layout's in order (Ray then places)."""
    from ray.util.placement_group import get_current_placement_group

    pg = get_current_placement_group()
    if pg is None:
        return None, 0
    specs = pg.bundle_specs
    # The layout's bundles last (after a trial's head bundle), or from the start.
    for offset in dict.fromkeys((len(specs) - len(bundles), 0)):
        window = specs[offset : offset + len(bundles)] if offset >= 0 else []
        if len(window) == len(bundles) and all(map(_fits, bundles, window)):
            return pg, offset
    return None, 0


def timeout_message(phase: str, timeout_s: float, missing: Sequence[str]) -> str:
    return (
        f"{', '.join(sorted(missing))} did not finish '{phase}' within {timeout_s:g}s: "
        f"{HINTS.get(phase, phase)}. Every actor of the run was stopped."
    )


@dataclass(eq=False)
class Member:
    """One actor of the group: its name, role, bundle, and how to start it again."""

    name: str
    role: str
    bundle_index: int
    cls: type
    args: tuple = ()
    actor: Any = None
    info: dict[str, Any] = field(default_factory=dict)  # what the backend learned of it


#: Called with (member, its error) when a member's own process died mid-wait; returns a new
#: ref to wait on in its place (an in-place replacement), or raises to end the wait.
OnLost = Callable[[Member, BaseException], Any]


class ActorGroup:
    """The actors of one attempt at running a layout, on the bundles of one placement group
    (or inside a caller's group, a Tune trial, when ``placement`` is None)."""

    def __init__(
        self,
        placement: PlacementGroup | None,
        bundles: list[dict[str, float]],
        runtime_env: dict[str, Any] | None = None,
        strategy: str = "PACK",
    ) -> None:
        self.placement = placement
        self.strategy = strategy
        self.bundles = bundles
        self.runtime_env = runtime_env
        self.members: list[Member] = []
        self.offset = 0  # of this layout's bundles in the placement group
        self.owned = placement is not None  # raytf's own reservation, not a Tune trial's
        if placement is None:  # inside a caller's group (a Tune trial)?
            self.placement, self.offset = _caller_group(bundles)
        # Actors a previous run left warm on this group, taken as members spawn.
        self.lease = POOL.lease(self.placement)

    # ------------------------------------------------------------------ members
    def spawn(self, name: str, role: str, bundle_index: int, cls: type, *args: Any) -> Member:
        member = Member(name, role, bundle_index, cls, args)
        member.actor = self._start(member)
        self.members.append(member)
        return member

    def _spec(self, member: Member) -> Spec:
        index = self.offset + member.bundle_index
        bundle = tuple(sorted(self.bundles[member.bundle_index].items()))
        return (index, member.cls, member.name, member.args, env_key(self.runtime_env), bundle)

    def _start(self, member: Member) -> Any:
        spec = self._spec(member)
        warm = self.lease.take(spec) or POOL.take_spare(self.placement, spec)
        if warm is not None:
            return warm
        placement = self.placement  # None in a caller's group that does not match: Ray places
        return start_actor(
            member.cls,
            member.name,
            member.args,
            self.bundles[member.bundle_index],
            placement,
            self.offset + member.bundle_index,
            self.runtime_env,
        )

    def replace(self, member: Member) -> Member:
        """A fresh actor for ``member`` on its bundle (the old one is dead, or killed here)."""
        with contextlib.suppress(Exception):
            ray.kill(member.actor, no_restart=True)
        member.actor = self._start(member)
        member.info = {}
        return member

    def of(self, role: str) -> list[Member]:
        return [m for m in self.members if m.role == role]

    # ------------------------------------------------------------------ calls
    def call(
        self,
        members: Sequence[Member],
        method: str,
        args: Sequence[tuple] | None = None,
        *,
        timeout_s: float,
        phase: str,
        on_lost: OnLost | None = None,
    ) -> list[Any]:
        """``method`` on each of ``members`` (``args[i]`` for member i; none by default)."""
        self.lease.close()  # every member is spawned by the first call
        args = args if args is not None else [()] * len(members)
        refs = {getattr(m.actor, method).remote(*a): m for m, a in zip(members, args)}
        done = self.wait(refs, timeout_s=timeout_s, phase=phase, on_lost=on_lost)
        return [done[m] for m in members]

    def wait(
        self,
        refs: Mapping[Any, Member],
        *,
        timeout_s: float,
        phase: str,
        on_lost: OnLost | None = None,
        watch: Mapping[Any, Member] | None = None,
        look_for_peers: bool = True,
    ) -> dict[Member, Any]:
        """Every result of ``refs``, failing fast: the first error ends the wait, a timeout
        names the laggards. ``watch``: calls that must not end while waiting (a TensorFlow
        task's blocking serve); if one does, its member is lost. ``on_lost`` may replace a
        lost member in place and hand back the ref to wait on instead. ``look_for_peers``: a
        survivor's error may be caused by a peer's death; report that death instead."""
        pending = dict(refs)
        watched = dict(watch or {})
        results: dict[Member, Any] = {}
        deadline = time.monotonic() + timeout_s
        while pending:
            left = max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait([*pending, *watched], num_returns=1, timeout=left)
            if not ready:
                raise StartupTimeoutError(
                    timeout_message(phase, timeout_s, [m.name for m in pending.values()])
                )
            ref = ready[0]
            is_watched = ref in watched
            member = watched.pop(ref) if is_watched else pending.pop(ref)
            try:
                value = ray.get(ref)
            except Exception as exc:
                error = unwrap(exc, member.name)
                own_death = isinstance(exc, ray.exceptions.RayActorError)
                if on_lost is not None and (is_watched or (own_death and recoverable(error))):
                    (watched if is_watched else pending)[on_lost(member, error)] = member
                    continue
                if isinstance(error, Preempted) and pending:
                    raise self._orderly(error, pending, deadline) from None
                raise self._cause(error, own_death, pending, watched, look_for_peers) from None
            if is_watched:  # a watched call returned: that member stopped serving
                error = WorkerError(
                    f"{member.name} stopped serving", worker=member.name, error_type="RayActorError"
                )
                if on_lost is None:
                    raise error
                watched[on_lost(member, error)] = member
                continue
            results[member] = value
        return results

    @staticmethod
    def _orderly(first: Preempted, pending: Mapping[Any, Member], deadline: float) -> Preempted:
        """A preemption is orderly: every worker checkpoints at the agreed step, then raises.
        Wait for the others before the group is stopped (the chief may still be writing the
        checkpoint a recovery restores), and report the one naming the checkpoint."""
        best, left = first, list(pending)
        while left:
            timeout = max(0.0, deadline - time.monotonic())
            ready, left = ray.wait(left, num_returns=1, timeout=timeout)
            if not ready:
                break
            try:
                ray.get(ready[0])
            except Exception as exc:
                other = unwrap(exc, pending[ready[0]].name)
                if isinstance(other, Preempted) and other.checkpoint and not best.checkpoint:
                    best = other
        return best

    @classmethod
    def _cause(
        cls,
        error: BaseException,
        own_death: bool,
        pending: Mapping[Any, Member],
        watched: Mapping[Any, Member],
        look_for_peers: bool,
    ) -> BaseException:
        """The error to report. A bug reported while a peer died: the death is the cause (and
        recoverable). A recoverable error while a watched member died (TensorFlow's chief
        failing because a task vanished): name that member."""
        if own_death:
            return error
        if look_for_peers and pending and not recoverable(error):
            found = cls._dead_peer(pending)
            if found is not None:
                return unwrap(found[1], found[0].name)
        if watched and recoverable(error):
            found = cls._dead_peer(watched)
            if found is not None:
                name = found[0].name
                return WorkerError(
                    f"{name} died ({error})", worker=name, error_type="RayActorError"
                )
        return error

    @staticmethod
    def _dead_peer(refs: Mapping[Any, Member]) -> tuple[Member, BaseException] | None:
        """A member among ``refs`` whose process died, if it shows within the grace period."""
        deadline = time.monotonic() + DEATH_GRACE_S
        left = list(refs)
        while left:
            ready, left = ray.wait(
                left, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            if not ready:
                return None
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as death:
                return refs[ready[0]], death
            except Exception:
                continue
        return None

    def start_spares(self, may_recover: bool) -> int:
        """Spares for a run that may recover, or whose group will be kept warm (they become
        the warm actors, already warm: see pool.py); how many were started."""
        if not may_recover and not POOL.parking(self.owned):
            return 0
        specs = [(self._spec(m), self.bundles[m.bundle_index]) for m in self.members]
        return POOL.add_spares(self.placement, specs, self.runtime_env)

    def drop_spares(self) -> None:
        POOL.drop_spares(self.placement)

    def shutdown(self, park: bool = False) -> None:
        """Stop every member; ``park``: a run that ended well leaves fresh actors of the
        same kind on the group for the next run (see pool.py)."""
        self.lease.close()
        specs = [(self._spec(m), self.bundles[m.bundle_index]) for m in self.members]
        for member in self.members:
            # Already gone, or Ray is shutting down: keep killing the rest.
            with contextlib.suppress(Exception):
                ray.kill(member.actor, no_restart=True)
        self.members = []
        if park and specs and self.placement is not None:
            POOL.park(  # the run's spares become the warm actors (pool.py)
                self.placement,
                self.owned,
                self.placement.bundle_specs,
                self.strategy,
                specs,
                self.runtime_env,
            )

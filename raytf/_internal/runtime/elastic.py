"""Elastic sizing, pure: which worker counts to try, and the batch each one trains with."""

from __future__ import annotations

from dataclasses import dataclass

from raytf.config import FailurePolicy

#: How long an elastic run waits for a smaller reservation once it has waited
#: ``replace_within_s`` for the full size.
RESIZE_PROBE_S = 5.0
#: After a failed probe for returned resources, the run does not probe again for this long
#: (free resources split over nodes fit no bundle, and each probe costs a second).
GROW_BACKOFF_S = 60.0


@dataclass(frozen=True)
class Sizing:
    """An elastic run's sizes: ``full`` workers of ``devices`` each, at ``global_batch_size``."""

    policy: FailurePolicy
    full: int
    devices: int
    global_batch_size: int

    def fits(self, workers: int) -> bool:
        """Whether ``workers`` workers split the global batch exactly (elastic "global")."""
        if self.policy.elastic_batch != "global":
            return True
        return self.global_batch_size % (workers * self.devices) == 0

    def batch_for(self, workers: int) -> int:
        """The global batch at ``workers`` workers: fixed ("global"), or each worker's share
        kept ("per_worker")."""
        if self.policy.elastic_batch == "global":
            return self.global_batch_size
        return self.global_batch_size * workers // self.full

    def sizes(self) -> list[int]:
        """Worker counts to try, largest first: the full size down to ``min_workers``."""
        low = self.policy.min_workers or self.full
        return [n for n in range(self.full, low - 1, -1) if self.fits(n)]

    def wait_for(self, attempt: int) -> float:
        """Seconds to wait for the ``attempt``-th size of :meth:`sizes` (0 is the full size)."""
        return self.policy.replace_within_s if attempt == 0 else RESIZE_PROBE_S

    def may_probe(self, workers: int, now: float, failed_at: float) -> bool:
        """Worth probing for the missing workers' resources: shrunk, and not backing off."""
        return self.policy.elastic and workers < self.full and now - failed_at >= GROW_BACKOFF_S

"""What a data function learns about its worker: :class:`InputContext`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InputContext:
    """Passed to your data function, once per worker actor.

    Return a ``tf.data.Dataset`` of single, unbatched examples ``(features, labels)`` (or
    ``(features, labels, sample_weight)``) for *this worker*; raytf batches it to
    :attr:`worker_batch_size` so the global batch is split exactly. Shard with
    :meth:`shard` (or read :attr:`worker_index` yourself) so workers see different data.
    """

    worker_index: int
    num_workers: int
    replicas_per_worker: int
    global_batch_size: int
    seed: int | None = None
    training: bool = True

    @property
    def num_replicas(self) -> int:
        return self.num_workers * self.replicas_per_worker

    @property
    def per_replica_batch_size(self) -> int:
        return self.global_batch_size // self.num_replicas

    @property
    def worker_batch_size(self) -> int:
        return self.per_replica_batch_size * self.replicas_per_worker

    def shard(self, dataset: Any) -> Any:
        """This worker's 1/num_workers of ``dataset`` (every num_workers-th example)."""
        if self.num_workers == 1:
            return dataset
        return dataset.shard(self.num_workers, self.worker_index)

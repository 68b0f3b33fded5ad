"""raytf.fit inside a Ray Tune trial (the user's own ``Tuner`` or :func:`raytf.sweep`).

Each epoch's logs go to Tune with ``tune.report``; at the run's checkpoints the report carries
a Tune checkpoint holding the newest raytf checkpoint (every worker's or server shard's), so
Tune's schedulers and retries have something to go on from: PBT's exploit, a
``FailureConfig`` retry and ``Tuner.restore`` start the trial again, ``tune.get_checkpoint()``
hands the checkpoint back, and ``fit`` resumes from it. Without ``checkpoint_dir=`` a trial's
checkpoints live in a temporary directory of the trial's node, removed when ``fit`` returns.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from raytf.callbacks import Callback

#: TensorFlow's checkpoint state file, in every directory a CheckpointManager writes.
STATE = "checkpoint"
#: Not part of a checkpoint: TensorBoard scalars, other workers' scratch copies.
SKIP = re.compile(r"^(summaries|\.scratch-.*)$")
RESTORE_PREFIX = "raytf-tune-restore-"


def in_trial() -> bool:
    """Is this process running a Tune trial's function (and not a Ray Train worker)?"""
    try:
        from ray.tune.trainable.trainable_fn_utils import _in_tune_session
    except ImportError:  # Tune not installed
        return False
    try:
        return bool(_in_tune_session())
    except Exception:  # an older or newer session API: no integration rather than a crash
        return False


@dataclass
class TrialCheckpoints:
    """Where a trial's run checkpoints, whether it resumes, and what to remove at the end."""

    checkpoint_dir: str | None
    resume: bool
    keep: int
    temporary: list[str] = field(default_factory=list)
    restored_from_tune: bool = False

    def cleanup(self) -> None:
        for path in self.temporary:
            shutil.rmtree(path, ignore_errors=True)


def setup(checkpoint_dir: str | None, resume: bool, keep: int, shared: bool) -> TrialCheckpoints:
    """The trial's checkpoint directory: Tune's checkpoint (if Tune restored the trial)
    copied into a new directory, else ``checkpoint_dir``, else a temporary one. ``shared``:
    the actors may run on other nodes, so a temporary directory on this one would not do."""
    from ray import tune

    tune_checkpoint = tune.get_checkpoint()
    temporary: list[str] = []
    if tune_checkpoint is not None:
        if checkpoint_dir:
            os.makedirs(checkpoint_dir, exist_ok=True)
        target = tempfile.mkdtemp(prefix=RESTORE_PREFIX, dir=checkpoint_dir or None)
        if not checkpoint_dir:
            temporary.append(target)
        tune_checkpoint.to_directory(target)
        return TrialCheckpoints(target, True, keep, temporary, restored_from_tune=True)
    if checkpoint_dir or shared:
        return TrialCheckpoints(checkpoint_dir, resume, keep)
    target = tempfile.mkdtemp(prefix="raytf-trial-")
    # Only the newest is ever reported: keeping more in a scratch directory is waste.
    return TrialCheckpoints(target, False, 1, [target])


def newest_only(root: str, into: str) -> str:
    """Copy the newest checkpoint of every checkpoint directory under ``root`` (the chief's,
    each parameter server shard's) into ``into``, with state files naming only it."""
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not SKIP.match(d) and not d.startswith(RESTORE_PREFIX)]
        target = os.path.join(into, os.path.relpath(here, root))
        if STATE not in files:
            continue
        with open(os.path.join(here, STATE)) as f:
            found = re.search(r'^model_checkpoint_path: "(.*)"$', f.read(), re.MULTILINE)
        if found is None:
            continue
        newest = os.path.basename(found.group(1))
        os.makedirs(target, exist_ok=True)
        for name in files:
            is_checkpoint_file = re.match(r"^.+-\d+\.(index|data-.*)$", name)
            if name == STATE or (is_checkpoint_file and not name.startswith(newest + ".")):
                continue
            shutil.copy2(os.path.join(here, name), os.path.join(target, name))
        with open(os.path.join(target, STATE), "w") as f:
            f.write(f'model_checkpoint_path: "{newest}"\nall_model_checkpoint_paths: "{newest}"\n')
    return into


class TuneReporter(Callback):
    """Reports each epoch's logs to Tune, with a Tune checkpoint at the run's checkpoints.

    ``raytf.fit`` adds one when it runs inside a trial; pass your own subclass in
    ``callbacks=`` to add metrics (override :meth:`extra`) and fit uses it instead.
    """

    def __init__(self) -> None:
        self.directory: str | None = None  # the run's checkpoint_dir, set by fit
        self._checkpoint: str | None = None

    def extra(self, epoch: int, logs: dict[str, float]) -> dict[str, Any]:
        """More values for this epoch's report."""
        return {}

    def on_checkpoint(self, epoch: int, path: str) -> None:
        self._checkpoint = path  # reported with this epoch's logs, which come next

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        from ray import tune

        metrics = {**logs, "epoch": epoch + 1, **self.extra(epoch, logs)}
        if self._checkpoint is None or not self.directory or not os.path.isdir(self.directory):
            tune.report(metrics)
            return
        self._checkpoint = None
        staged = tempfile.mkdtemp(prefix="raytf-tune-report-")
        try:
            newest_only(self.directory, staged)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(staged))
        finally:  # Tune copied it to the trial's storage during report
            with contextlib.suppress(OSError):
                shutil.rmtree(staged)

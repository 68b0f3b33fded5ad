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
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from raytf.callbacks import Callback
from raytf.errors import ConfigError

RESTORE_PREFIX = "raytf-tune-restore-"

#: TensorFlow's checkpoint state file, in every directory a CheckpointManager writes.
STATE = "checkpoint"
#: In every Tune checkpoint raytf reports: the epoch, and what a restored trial carries on.
MARKER = "raytf.json"
#: Where a restored trial's checkpoint goes inside a user's checkpoint_dir (replaced each time).
RESTORED = "tune-restored"
#: Not part of a checkpoint: TensorBoard scalars, other workers' scratch copies, restores.
SKIP = re.compile(rf"^(summaries|\.scratch-.*|{RESTORED}|{RESTORE_PREFIX}.*)$")

logger = logging.getLogger("raytf")


class _Reported:
    """The Tune checkpoint raytf's last report left as the trial's: a second ``fit`` in the
    same trial function must not take it for a restore."""

    last: Any = None


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
    carried: dict[str, Any] = field(default_factory=dict)  # from the restored checkpoint

    def cleanup(self) -> None:
        for path in self.temporary:
            shutil.rmtree(path, ignore_errors=True)


def setup(checkpoint_dir: str | None, resume: bool, keep: int, shared: bool) -> TrialCheckpoints:
    """The trial's checkpoint directory: Tune's checkpoint (if Tune restored the trial)
    copied into a new directory, else ``checkpoint_dir``, else a temporary one. ``shared``:
    the actors may run on other nodes, so a temporary directory on this one would not do."""
    from ray import tune

    given = tune.get_checkpoint()
    if given is not None and given is not _Reported.last:  # not an earlier fit's, this run
        restored = _restore(given, checkpoint_dir, keep, shared)
        if restored is not None:
            return restored
    if checkpoint_dir or shared:
        if shared and not checkpoint_dir:
            logger.warning(
                "raytf: this Tune trial reports metrics but no checkpoints: its actors may run "
                "on other nodes than the trial, so they need checkpoint_dir= on storage every "
                "node can read (PBT, FailureConfig retries and Tuner.restore need checkpoints)."
            )
        return TrialCheckpoints(checkpoint_dir, resume, keep)
    target = tempfile.mkdtemp(prefix="raytf-trial-")
    # Only the newest is ever reported: keeping more in a scratch directory is waste.
    return TrialCheckpoints(target, False, 1, [target])


def _restore(
    given: Any, checkpoint_dir: str | None, keep: int, shared: bool
) -> TrialCheckpoints | None:
    """Tune's checkpoint copied where the run resumes from; None if it is not raytf's."""
    if shared and not checkpoint_dir:
        raise ConfigError(
            "Tune restored this trial from a checkpoint, but its raytf actors may run on "
            "other nodes, which cannot read a copy on this one: pass checkpoint_dir= on "
            "storage every node can read (raytf.sweep(checkpoint_dir=...) for a sweep)."
        )
    temporary = []
    if checkpoint_dir:
        target = os.path.join(checkpoint_dir, RESTORED)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
    else:
        target = tempfile.mkdtemp(prefix=RESTORE_PREFIX)
        temporary.append(target)
    given.to_directory(target)
    marker = os.path.join(target, MARKER)
    if not os.path.exists(marker):
        logger.warning(
            "raytf: the trial's Tune checkpoint was not written by raytf.fit (no %s): "
            "training starts from scratch.",
            MARKER,
        )
        for path in temporary:
            shutil.rmtree(path, ignore_errors=True)
        return None
    with open(marker) as f:
        carried = json.load(f).get("carried", {})
    return TrialCheckpoints(target, True, keep, temporary, True, carried)


def newest_only(root: str, into: str) -> str:
    """Copy the newest checkpoint of every checkpoint directory under ``root`` (the chief's,
    each parameter server shard's) into ``into``, with state files naming only it."""
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not SKIP.match(d)]
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

    ``raytf.fit`` adds one when it runs inside a trial (``raytf.sweep`` passes a subclass
    with more values: :meth:`extra`, and :meth:`carry` for what a restored trial goes on
    counting from).
    """

    def __init__(self) -> None:
        self.directory: str | None = None  # the run's checkpoint_dir, set by fit
        self.carried: dict[str, Any] = {}  # what the checkpoint it resumed from carried
        self._checkpoint: str | None = None

    def extra(self, epoch: int, logs: dict[str, float]) -> dict[str, Any]:
        """More values for this epoch's report."""
        return {}

    def carry(self, report: dict[str, Any]) -> dict[str, Any]:
        """Values of ``report`` a trial restored from this checkpoint goes on from."""
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
            with open(os.path.join(staged, MARKER), "w") as f:
                json.dump({"epoch": epoch + 1, "carried": self.carry(metrics)}, f)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(staged))
            _Reported.last = tune.get_checkpoint()  # Tune's persisted copy, now the trial's
        finally:  # Tune copied it to the trial's storage during report
            with contextlib.suppress(OSError):
                shutil.rmtree(staged)

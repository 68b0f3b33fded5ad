"""A Ray runtime environment for raytf's actors, with local paths uploaded once.

Ray takes local ``working_dir`` / ``py_modules`` paths only at the job level (``ray.init``);
an actor's ``runtime_env`` must name URIs. raytf uploads the local paths to the cluster the
way ``ray.init`` does (Ray's own upload helpers, content-addressed, so a second run reuses
the upload) and hands every actor the URIs.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from raytf.errors import ConfigError

log = logging.getLogger("raytf")


def check(runtime_env: Any) -> None:
    """Before Ray starts: a dict, and its local paths exist."""
    if runtime_env is None:
        return
    if not isinstance(runtime_env, dict):
        raise ConfigError(
            f"runtime_env must be a dict as Ray takes it, received {type(runtime_env).__name__}"
            "; for example runtime_env={'working_dir': '.'} or {'py_modules': ['mypkg']}."
        )
    for key in ("working_dir", "py_modules"):
        paths = runtime_env.get(key)
        for path in paths if isinstance(paths, list) else [paths]:
            if isinstance(path, str) and "://" not in path and not os.path.exists(path):
                raise ConfigError(
                    f"runtime_env {key} {path!r} does not exist (relative to "
                    f"{os.getcwd()!r}); pass a directory (or .py file / package) on this machine."
                )


def for_actors(runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
    """``runtime_env`` with its local paths replaced by cluster URIs (uploaded if needed)."""
    if not runtime_env:
        return None
    import ray
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    node = getattr(ray._private.worker.global_worker, "node", None)
    if node is None:  # Ray Client uploads on the server side
        return dict(runtime_env)
    scratch = node.get_runtime_env_dir_path()
    env = upload_py_modules_if_needed(
        dict(runtime_env), include_gitignore=True, scratch_dir=scratch, logger=log
    )
    env = upload_working_dir_if_needed(env, include_gitignore=True, scratch_dir=scratch, logger=log)
    env.pop("excludes", None)
    return env

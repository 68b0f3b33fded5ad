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


def _is_local(path: Any) -> bool:
    return isinstance(path, str) and "://" not in path


def check(runtime_env: Any) -> None:
    """Before Ray starts: a dict, and its local paths exist."""
    if runtime_env is None:
        return
    if not isinstance(runtime_env, dict):
        raise ConfigError(
            f"runtime_env must be a dict as Ray takes it, received {type(runtime_env).__name__}"
            "; for example runtime_env={'working_dir': '.'} or {'py_modules': ['mypkg']}."
        )
    if "py_modules" in runtime_env and not isinstance(runtime_env["py_modules"], list):
        raise ConfigError(
            f"runtime_env py_modules must be a list, received {runtime_env['py_modules']!r}; "
            "for example {'py_modules': ['src/mypkg']}."
        )
    for key in ("working_dir", "py_modules"):
        paths = runtime_env.get(key)
        for path in paths if isinstance(paths, list) else [paths]:
            if _is_local(path) and not os.path.exists(path):
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

    local = []
    for key in ("working_dir", "py_modules"):
        paths = runtime_env.get(key)
        local += [p for p in (paths if isinstance(paths, list) else [paths]) if _is_local(p)]
    node = getattr(ray._private.worker.global_worker, "node", None)
    if node is None:  # Ray Client: only the job-level env uploads local paths
        if local:
            raise ConfigError(
                f"runtime_env names local paths {local}, which Ray uploads only for the whole "
                "job under Ray Client (ray://): pass it to ray.init(address='ray://...', "
                "runtime_env=...) before calling raytf, and drop it here."
            )
        return dict(runtime_env)
    scratch = node.get_runtime_env_dir_path()
    try:
        env = upload_py_modules_if_needed(
            dict(runtime_env), include_gitignore=True, scratch_dir=scratch, logger=log
        )
        env = upload_working_dir_if_needed(
            env, include_gitignore=True, scratch_dir=scratch, logger=log
        )
    except (ValueError, TypeError, OSError, RuntimeError) as exc:
        raise ConfigError(
            f"runtime_env {runtime_env!r} could not be uploaded to the cluster: "
            f"{type(exc).__name__}: {exc}. working_dir takes a directory (or a .zip), "
            "py_modules a list of package directories, .py files or wheels."
        ) from exc
    env.pop("excludes", None)
    return env

"""Start-up cleaning of the weight and engine caches: what a killed build left behind.

Both caches build an entry in a ``.build-<random>`` directory and rename it into place when it
is whole, so a process killed mid-build (SIGKILL, power loss, the watchdog) leaves the
directory forever: on a robot's small disk, a model's worth of bytes each time. Its name says
nothing about its owner, and the service, a DynamicUser under ProtectProc=invisible, cannot
see other processes' open files; so a ``.build-*`` counts as abandoned once nothing in it has
changed for ``stale_s`` (a live build writes its files as it goes; an engine build that
computes for longer than that without writing would lose its scratch directory and fail,
never serve a partial entry). The weight cache's ``.old-<entry>-<pid>`` (an entry being
replaced) names its owner, and goes when that process is gone.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger("thor.serve")
STALE_S = 3600.0


def _newest_mtime(d: Path) -> float:
    newest = d.stat().st_mtime
    for p in d.rglob("*"):
        try:
            newest = max(newest, p.stat().st_mtime)
        except OSError:  # removed meanwhile
            pass
    return newest


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def abandoned(d: Path, now: float, stale_s: float) -> bool:
    if d.name.startswith(".build-"):
        return now - _newest_mtime(d) > stale_s
    if d.name.startswith(".old-"):
        pid = d.name.rsplit("-", 1)[-1]
        return pid.isdigit() and not _pid_alive(int(pid))
    return False


def remove_abandoned(roots, stale_s: float = STALE_S, now: float | None = None) -> list[Path]:
    """Remove the abandoned build directories directly under each root. -> what was removed."""
    now = time.time() if now is None else now
    gone = []
    for root in roots:
        if root is None or not Path(root).is_dir():
            continue
        for d in sorted(Path(root).glob(".*-*")):
            try:
                if d.is_dir() and not d.is_symlink() and abandoned(d, now, stale_s):
                    shutil.rmtree(d)
                    gone.append(d)
            except OSError as e:  # another process's, or removed meanwhile: leave it
                log.warning("could not remove the leftover %s: %s", d, e.strerror or e)
    if gone:
        log.info("removed %d leftover(s) of interrupted cache builds", len(gone))
    return gone


def cache_roots(cfg) -> list[Path]:
    """The weight cache and the engine cache the service's runtime uses."""
    from thor_runtime.fileio import default_cache_dir

    roots = [default_cache_dir()]
    try:
        from engines.base import default_cache_dir as engine_cache_dir
    except ImportError:
        return roots
    engine = getattr(cfg.engine, "cache_dir", "") or ""
    roots.append(Path(engine) if engine else engine_cache_dir())
    return roots

"""The resource limits a container gets, set so that the engine can always set them.

An engine left to its defaults asks the OCI runtime for limits of its own choosing (podman
as root: 1,048,576 open files), and setting a limit above the hard limit of the process
that sets it needs ``CAP_SYS_RESOURCE``; without it runc fails the start ("error setting
rlimit type 7: operation not permitted"). So a container gets:

- open files (``nofile``): the agent's own soft and hard limits, which the engine, started
  by the agent, inherits;
- processes (``nproc``): the agent's own, but no more than the container's pids limit
  (the engine may run under a lower process limit than the agent's: podman as root does).
"""

from __future__ import annotations

import resource


def ulimit_args(pids_limit: int) -> list[str]:
    """``--ulimit`` options for ``nofile`` and ``nproc`` as above (``-1``: unlimited), in
    the syntax both podman and docker take."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    nproc = (_at_most(soft, pids_limit), _at_most(hard, pids_limit))
    return ["--ulimit", _option("nofile", nofile), "--ulimit", _option("nproc", nproc)]


def _at_most(limit: int, cap: int) -> int:
    return cap if limit == resource.RLIM_INFINITY else min(limit, cap)


def _option(name: str, limits: tuple[int, int]) -> str:
    soft, hard = ("-1" if v == resource.RLIM_INFINITY else str(v) for v in limits)
    return f"{name}={soft}:{hard}"

"""No process outlives its parent: a child asks the kernel for a signal when its parent dies.

`laneway up` may be SIGKILLed, a broker may be SIGKILLed with a Presidio pool of 500 MB
processes under it, a test run may die mid-module: in each case the children would otherwise
be re-parented to init and live on. Linux's PR_SET_PDEATHSIG ends them instead. Elsewhere this
is a no-op (and the usual shutdown paths still stop children).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1

_prctl = None
if sys.platform.startswith("linux"):
    # Bound once here, not in the child: the child runs between fork and exec, where looking a
    # library up could take a lock that another thread of the parent held at fork time.
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """In a child (a `preexec_fn` bound to the parent's pid, or a pool initializer): be sent
    `sig` when `parent_pid` dies; if it already died before the request took effect, go now.
    The pid is the parent's own, taken in the parent: `getppid() == 1` would misread a parent
    that runs as PID 1 (a container's entry point) as a dead one."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def tied_to_this_process(sig: int = signal.SIGTERM):
    """A `preexec_fn` that ties the child to the process that starts it."""
    return functools.partial(die_with_parent, os.getpid(), sig)


def end_group(leader: int) -> None:
    """Ends what a child started in a session of its own (`start_new_session`) left behind once
    it is gone: its process group, whose id is its pid. A process it started that does not ask
    for PR_SET_PDEATHSIG (vLLM's engine core under a worker) lives on otherwise, holding its
    memory (a GPU's, on a GPU host) from the worker started in its place."""
    if hasattr(os, "killpg"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)

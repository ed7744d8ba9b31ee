"""No process outlives its parent: a child asks the kernel for a signal when its parent dies.

`laneway up` may be SIGKILLed, a broker may be SIGKILLed with a Presidio pool of 500 MB
processes under it, a test run may die mid-module: in each case the children would otherwise
be re-parented to init and live on. Linux's PR_SET_PDEATHSIG ends them instead. Elsewhere this
is a no-op (and the usual shutdown paths still stop children).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1

_prctl = None
if sys.platform.startswith("linux"):
    # Bound once here, not in the child: the child runs between fork and exec, where looking a
    # library up could take a lock that another thread of the parent held at fork time.
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child (a `preexec_fn` or a pool initializer): be sent `sig` when the parent dies.
    If the parent already died before the request took effect, go now."""
    if _prctl is None:
        return
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent == 1 or os.getppid() != parent:
        os.kill(os.getpid(), sig)


def pool_initializer_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> None:
    """A pool worker's half of `die_with_parent`, for when the worker is itself a fresh process
    (spawn): ties it to `parent_pid`, the process that made the pool."""
    if _prctl is None:
        return
    _prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)

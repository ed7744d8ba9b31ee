"""How `laneway up` shares its command line with its children: the flags it does not take itself
go to each role whose own command takes them (`route_flags`), a few are refused as unshareable,
and what several children of one role need apart: their names, worker ids, metrics ports.
"""

from __future__ import annotations

import argparse

from core import env


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value `argv` gives `flag` (`--flag X` or `--flag=X`; the last one wins, as in argparse)."""
    value = None
    for i, token in enumerate(argv):
        if token == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(f"{flag}="):
            value = token.split("=", 1)[1]
    return value


def subject_prefix(forwarded: dict[str, list[str]]) -> str:
    """The subject prefix the children were given, else "lw"."""
    return _flag_value(forwarded["broker"], "--prefix") or env.PREFIX.get()


def instances(role: str, n: int) -> list[str]:
    """The children's names: the role itself when there is one (as before `--brokers N`)."""
    return [role] if n == 1 else [f"{role}-{i}" for i in range(1, n + 1)]


def metrics_argv(ports: dict[str, int], name: str) -> list[str]:
    """The child's own port for its Prometheus metrics (chosen once: kept across its restarts)."""
    return ["--metrics-port", str(ports[name])] if name in ports else []


def worker_argvs(argv: list[str], n: int) -> list[list[str]]:
    """One argv per worker. Ids are unique: a `--worker-id X` given to `up` becomes X-1, X-2...
    for several workers; without one, each worker draws its own."""
    base = _flag_value(argv, "--worker-id")
    if n == 1 or base is None:
        return [list(argv) for _ in range(n)]
    return [[*argv, "--worker-id", f"{base}-{i}"] for i in range(1, n + 1)]  # the last one wins


ROLES = ("broker", "worker", "bridge")
# Flags that cannot be shared by processes on one host, or that `up` owns (its own nats-server).
_NOT_FORWARDED = {
    "--metrics-port": "each process needs its own port: run the roles separately "
    "(`laneway broker|worker|bridge --metrics-port N`)",
    "--nats-url": "laneway up runs its own nats-server",
    "--nats-user": "laneway up runs its own nats-server",
    "--nats-password": "laneway up runs its own nats-server",
}


class FlagError(ValueError):
    pass


def route_flags(tokens: list[str], role_parsers: dict[str, argparse.ArgumentParser]) -> dict[str, list[str]]:
    """Flags `up` does not take itself go to every role whose own command takes them:
    `--ack-wait 10` to the broker (and `up`'s provisioning), `--sim-profile X` to the worker."""
    routed: dict[str, list[str]] = {role: [] for role in role_parsers}
    groups: list[list[str]] = []
    for token in tokens:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)  # a value of the flag before it
    for group in groups:
        flag = group[0].split("=", 1)[0]
        if flag in _NOT_FORWARDED:
            raise FlagError(f"{flag}: {_NOT_FORWARDED[flag]}")
        # argparse has no public lookup of an option string
        roles = [role for role, parser in role_parsers.items() if flag in parser._option_string_actions]
        if not flag.startswith("--") or not roles:
            raise FlagError(f"unrecognized arguments: {' '.join(group)}")
        for role in roles:
            routed[role] += group
    return routed

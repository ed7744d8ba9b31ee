"""The layout's rules, read from the source with `ast` so nothing is imported: every `import x`
and `from x import y`, those inside functions and `TYPE_CHECKING` blocks too (a lazy import is
still a dependency).

- Presidio and spaCy are loaded in `broker/pii_analysis/` alone (its processes, never an event loop).
- Ranks: each top-level folder has one, in the order a request meets them. A module imports only
  its own folder and folders of a lower rank; folders of one rank (the three processes) never
  import each other. The bridge's wings are ranked the same way (`BRIDGE_WINGS`).
- Purity: the policy documents and decisions, the lanes, the sim scheduler and roofline, the
  breaker and the wire types import only the standard library's pure modules, msgspec, regex and
  each other: no I/O library, no clock-free code reaching for a socket.
- One environment registry: `os.environ` and `os.getenv` appear in `core/env.py` alone.
- No module over 400 lines; no import cycle between packages (each sub-package and top-level
  module of a folder is one), nor between files anywhere: two modules that need each other hold
  a piece that belongs in a third. `pytest -s` prints the package dependency list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANK = {
    "schemas": 0,  # the wire contract
    "core": 1,  # what every process shares
    "bridge": 2,  # the HTTP edge process
    "broker": 2,  # the gate, the lanes, the scheduler
    "workers": 2,  # the worker loop and its engines
    "loadtest": 3,  # benchmarks and the planner, over the product
    "laneway": 4,  # the command line, over everything it can start
    "tools": 5,  # offline tools (not installed): over the product, imported by none of it
}
TOPS = tuple(RANK)
# Pure: a module named here, or inside a package named here.
PURE = (
    "schemas",
    "core.policy",
    "core.routing.rules",
    "core.routing.health",
    "broker.lanes",
    "broker.waiting",
    "broker.room",
    "broker.affinity",
    "broker.balance",
    "broker.headroom",
    "broker.pools",
    "broker.running",
    "workers.engines.sim.scheduler",
    "workers.engines.sim.roofline",
    "workers.engines.openai.circuit",
)
PURE_OUTSIDE = {
    "__future__",
    "abc",
    "bisect",
    "collections",
    "collections.abc",
    "copy",
    "dataclasses",
    "datetime",
    "enum",
    "functools",
    "hashlib",
    "heapq",
    "hmac",
    "ipaddress",
    "itertools",
    "math",
    "numbers",
    "operator",
    "re",
    "string",
    "time",
    "typing",
    "msgspec",
    "regex",
}
ENV_REGISTRY = "core.env"
MAX_LINES = 400

# Package cycles that exist today, each as the set of packages in one strongly connected
# component. This set may only shrink: a new cycle fails, and so does one listed here that is gone.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name → (file, is a package's __init__)."""
    out = {}
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] != "schemas" and len(parts) > 1 else parts[0]


def _imports(module: str, path: Path, is_pkg: bool, known: dict) -> Iterator[str]:
    """Every module `module` imports, ours by their dotted names and others' as written."""
    here = module.split(".") if is_pkg else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1] + ([node.module] if node.module else [])
                target = ".".join(base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"  # `from core import env` names a module
                yield sub if sub in known else target


def _all_imports() -> list[tuple[str, str]]:
    known = _modules()
    return sorted(
        {(mod, target) for mod, (path, is_pkg) in known.items() for target in _imports(mod, path, is_pkg, known)}
    )


def ours(edges: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(importing module, imported module of ours), one per distinct pair."""
    return [(src, dst) for src, dst in edges if dst.split(".")[0] in TOPS]


# The bridge's wings, each built on those below it: the shell's leaves (rank 0: they may import
# each other, without a cycle), the way back (frames, rendering, resuming), the one generation
# path, the endpoints over it, the app. Wings of one rank never import each other.
BRIDGE_WINGS = {
    **dict.fromkeys(
        (
            "bridge.errors",
            "bridge.metrics",
            "bridge.readiness",
            "bridge.publish_errors",
            "bridge.paging",
            "bridge.auth",
            "bridge.server",
            "bridge.openapi",
            "bridge.admin",
        ),
        0,
    ),
    "bridge.streams": 1,  # frames back, by request
    **dict.fromkeys(("bridge.render", "bridge.config", "bridge.client"), 2),
    "bridge.resume": 3,
    "bridge.generate": 4,  # the one path every generation takes
    **dict.fromkeys(("bridge.responses", "bridge.files"), 5),
    "bridge.batch": 6,
    "bridge.app": 7,
}


def wing_violations(edges: list[tuple[str, str]]) -> list[str]:
    wrong = []
    for src, dst in ours(edges):
        a, b = package_of(src), package_of(dst)
        if a == b or a not in BRIDGE_WINGS or b not in BRIDGE_WINGS:
            continue
        if BRIDGE_WINGS[b] > BRIDGE_WINGS[a] or BRIDGE_WINGS[b] == BRIDGE_WINGS[a] > 0:
            wrong.append(f"{src} (wing rank {BRIDGE_WINGS[a]}) imports {dst} (wing rank {BRIDGE_WINGS[b]})")
    return wrong


def test_bridge_wings_import_down_only(edges) -> None:
    unranked = sorted({package_of(m) for m in _modules() if m.startswith("bridge.")} - set(BRIDGE_WINGS))
    assert not unranked, f"give these bridge modules a wing rank: {unranked}"
    assert not wing_violations(edges), "\n".join(wing_violations(edges))
    assert wing_violations([("bridge.streams.demux", "bridge.render.sse")])
    assert wing_violations([("bridge.files.routes", "bridge.responses.stored.store")])
    assert wing_violations([("bridge.errors", "bridge.generate.routes")])
    assert not wing_violations([("bridge.auth", "bridge.errors"), ("bridge.batch.api", "bridge.files.store")])


def rank_violations(edges: list[tuple[str, str]]) -> list[str]:
    wrong = []
    for src, dst in ours(edges):
        a, b = src.split(".")[0], dst.split(".")[0]
        if a != b and RANK[b] >= RANK[a]:
            wrong.append(f"{src} (rank {RANK[a]}) imports {dst} (rank {RANK[b]})")
    return wrong


def _is_pure(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PURE)


def purity_violations(edges: list[tuple[str, str]]) -> list[str]:
    return [
        f"{src} is pure but imports {dst}"
        for src, dst in edges
        if _is_pure(src) and not (_is_pure(dst) or dst in PURE_OUTSIDE)
    ]


def environ_reads(module: str, source: str) -> list[str]:
    """Where `source` touches the process environment through `os` (`os.environ`, `os.getenv`,
    `from os import environ`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "putenv", "unsetenv")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(f"{module}:{node.lineno} os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                f"{module}:{node.lineno} from os import {a.name}"
                for a in node.names
                if a.name in ("environ", "getenv", "putenv", "unsetenv")
            ]
    return found


def dependencies(edges: list[tuple[str, str]]) -> dict[str, set[str]]:
    deps: dict[str, set[str]] = {package_of(m): set() for m in _modules()}
    for src, dst in ours(edges):
        if package_of(src) != package_of(dst):
            deps[package_of(src)].add(package_of(dst))
    return deps


def module_dependencies(edges: list[tuple[str, str]]) -> dict[str, set[str]]:
    """Module → the other modules of ours it imports (a package by its `__init__`)."""
    deps: dict[str, set[str]] = {m: set() for m in _modules()}
    for src, dst in ours(edges):
        if dst in deps and dst != src:
            deps[src].add(dst)
    return deps


def cycles(deps: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for root in sorted(deps):
        if root in index:
            continue
        work = [(root, iter(sorted(deps[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(deps.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


@pytest.fixture(scope="module")
def edges() -> list[tuple[str, str]]:
    return _all_imports()


def test_each_folder_imports_only_folders_of_a_lower_rank(edges) -> None:
    wrong = rank_violations(edges)
    assert not wrong, "\n".join(wrong)


def test_pure_modules_import_no_io(edges) -> None:
    wrong = purity_violations(edges)
    assert not wrong, "\n".join(wrong)


def test_the_environment_is_read_in_the_registry_alone() -> None:
    reads = [
        hit
        for mod, (path, _) in _modules().items()
        if mod != ENV_REGISTRY
        for hit in environ_reads(mod, path.read_text())
    ]
    assert not reads, "read these through core/env.py:\n" + "\n".join(reads)


# Presidio and spaCy hold the GIL for up to hundreds of milliseconds a call: only the analysis
# pool's processes may load them (and the PII benchmark, which measures stock Presidio).
ANALYSERS = ("presidio_analyzer", "spacy")
ANALYSIS_HOME = ("broker.pii_analysis", "loadtest.pii_bench")


def analyser_imports(edges) -> list[str]:
    return sorted(
        f"{a} imports {b}" for a, b in edges if b.split(".")[0] in ANALYSERS and not a.startswith(ANALYSIS_HOME)
    )


def test_only_the_analysis_pool_loads_presidio_and_spacy(edges) -> None:
    assert not analyser_imports(edges), "\n".join(analyser_imports(edges))
    assert analyser_imports([("broker.gate.pii.gate", "presidio_analyzer")])
    assert ("broker.pii_analysis.ner", "spacy") in edges


def test_no_module_is_over_the_line_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path, _ in _modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, "\n".join(long)


def test_no_cycles_between_packages_but_the_known_ones(edges) -> None:
    deps = dependencies(edges)
    print("\npackage dependencies:")
    for package in sorted(deps):
        print(f"  {package} -> {sorted(deps[package])}")
    found = cycles(deps)
    print("cycles:", sorted(sorted(c) for c in found) or "none")
    new = found - KNOWN_CYCLES
    gone = KNOWN_CYCLES - found
    assert not new, "new import cycles between packages: " + "; ".join(" ↔ ".join(sorted(c)) for c in new)
    assert not gone, "these cycles are gone, take them out of KNOWN_CYCLES: " + "; ".join(
        " ↔ ".join(sorted(c)) for c in gone
    )


def test_no_cycles_between_modules(edges) -> None:
    found = cycles(module_dependencies(edges))
    assert not found, "modules that import each other (at any depth, TYPE_CHECKING too): " + "; ".join(
        " ↔ ".join(sorted(c)) for c in sorted(found, key=sorted)
    )


def test_the_checks_see_the_tree_and_catch_a_wrong_import(edges) -> None:
    """Guards the test itself: a walk that found nothing would pass everything above."""
    deps = dependencies(edges)
    assert {
        "schemas",
        "core.policy",
        "core.routing",
        "bridge.app",
        "broker.gate",
        "broker.app",
        "workers.engines",
        "laneway.cli",
        "loadtest.stack",
    } <= set(deps)
    assert "core.routing" in deps["broker.gate"]
    assert ("bridge.streams.demux", "schemas.codec") in edges  # `from schemas import codec`
    assert ("broker.lanes", "heapq") in edges  # others' modules, as written
    # A lower layer importing a higher one, peers importing each other, a pure module's I/O:
    assert rank_violations([("core.settings", "broker.config")])
    assert rank_violations([("workers.serve", "broker.gate.pii")])
    assert rank_violations([("bridge.generate.routes", "laneway.flags")])
    assert not rank_violations([("laneway.cli", "loadtest.planner"), ("broker.gate.route", "core.routing")])
    assert purity_violations([("core.policy.quota", "nats.js"), ("broker.lanes", "asyncio")]) == [
        "core.policy.quota is pure but imports nats.js",
        "broker.lanes is pure but imports asyncio",
    ]
    assert environ_reads("x", "import os\nkey = os.environ.get('K')\nfrom os import getenv")
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}
    # Imports inside functions are edges (how cycles hide); two files importing each other are a cycle.
    assert ("laneway.processes", "core.routing.eval_gate") in edges
    assert cycles(
        module_dependencies(
            [("core.env", "core.tasks"), ("core.tasks", "core.env"), ("core.routing.classifier", "schemas.requests")]
        )
    ) == {frozenset({"core.env", "core.tasks"})}
    assert "tools.routing.train_classifier" in module_dependencies(edges)

"""Imports run one way: schemas ← policy and engines ← I/O loops ← processes ← the `laneway`
CLI, with `loadtest/` beside, importing the product and never imported by it.

Read from the source with `ast`, so nothing is imported: every `import x` and `from x import y`,
those inside functions and `TYPE_CHECKING` blocks too (a lazy import is still a dependency).
Modules map to packages: each sub-package and top-level module of `broker/` is one
(`broker.gate`, `broker.config`, ...), every other top-level folder is one. `pytest -s` prints
the package dependency list.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("schemas", "broker", "workers", "laneway", "loadtest")
PRODUCT = ("schemas", "broker", "workers")
ABOVE_PRODUCT = ("laneway", "loadtest")

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
    return ".".join(parts[:2]) if parts[0] == "broker" and len(parts) > 1 else parts[0]


def _imports(module: str, path: Path, is_pkg: bool, known: dict) -> Iterator[str]:
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
                sub = f"{target}.{alias.name}"    # `from broker import config` names a module
                yield sub if sub in known else target


def _edges() -> list[tuple[str, str]]:
    """(importing module, imported module of ours), one per distinct pair."""
    known = _modules()
    return sorted({(mod, target) for mod, (path, is_pkg) in known.items()
                   for target in _imports(mod, path, is_pkg, known)
                   if target.split(".")[0] in TOPS})


def dependencies(edges: list[tuple[str, str]]) -> dict[str, set[str]]:
    deps: dict[str, set[str]] = {package_of(m): set() for m in _modules()}
    for src, dst in edges:
        if package_of(src) != package_of(dst):
            deps[package_of(src)].add(package_of(dst))
    return deps


def cycles(deps: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one package (Tarjan, iterative)."""
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
    return _edges()


def test_the_product_never_imports_the_cli_or_the_benchmarks(edges) -> None:
    wrong = [f"{src} imports {dst}" for src, dst in edges
             if src.split(".")[0] in PRODUCT and dst.split(".")[0] in ABOVE_PRODUCT]
    assert not wrong, "\n".join(wrong)


def test_schemas_import_nothing_of_ours(edges) -> None:
    wrong = [f"{src} imports {dst}" for src, dst in edges
             if src.split(".")[0] == "schemas" and dst.split(".")[0] != "schemas"]
    assert not wrong, "\n".join(wrong)


def test_no_cycles_between_packages_but_the_known_ones(edges) -> None:
    deps = dependencies(edges)
    print("\npackage dependencies:")
    for package in sorted(deps):
        print(f"  {package} -> {sorted(deps[package])}")
    found = cycles(deps)
    print("cycles:", sorted(sorted(c) for c in found) or "none")
    new = found - KNOWN_CYCLES
    gone = KNOWN_CYCLES - found
    assert not new, "new import cycles between packages: " + "; ".join(
        " ↔ ".join(sorted(c)) for c in new)
    assert not gone, "these cycles are gone, take them out of KNOWN_CYCLES: " + "; ".join(
        " ↔ ".join(sorted(c)) for c in gone)


def test_the_walk_sees_the_tree(edges) -> None:
    """Guards the test itself: a walk that found nothing would pass everything above."""
    deps = dependencies(edges)
    assert {"schemas", "broker.gate", "broker.routing", "broker.runtime", "workers", "laneway",
            "loadtest"} <= set(deps)
    assert "broker.routing" in deps["broker.gate"]
    assert ("broker.demux", "schemas.codec") in edges     # `from schemas import codec`
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}

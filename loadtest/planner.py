"""`laneway plan`: capacity and budget planner (the CLI edge: flags, TOML, printing).

Layers, later wins: --scenario preset, then --config TOML, then flags. The merged dict is
validated once by msgspec into `PlanInput`; any bad value exits 2 with the parameter named.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import tomllib
from typing import Any

import msgspec

from loadtest.planner_model import PlanError, PlanInput, check_input
from loadtest.planner_presets import GPU_PRESETS, SCENARIOS
from loadtest.planner_report import build_report, render_text

# flag dest -> dotted path in PlanInput; also used to name the flag in error messages.
FLAGS: dict[str, str] = {
    "qps": "load.qps",
    "dau": "load.dau",
    "requests_per_user": "load.requests_per_user_day",
    "peak_factor": "load.peak_factor",
    "concurrency": "load.concurrency",
    "think_time": "load.think_time_s",
    "tokens_in": "load.tokens_in",
    "tokens_out": "load.tokens_out",
    "prefix_hit_rate": "load.prefix_hit_rate",
    "gpu_memory_gb": "gpu.memory_gb",
    "gpu_bandwidth_tbs": "gpu.bandwidth_tbs",
    "gpu_tflops_bf16": "gpu.tflops_bf16",
    "gpu_tflops_fp8": "gpu.tflops_fp8",
    "gpu_tflops_fp4": "gpu.tflops_fp4",
    "gpu_usd_per_hour": "gpu.usd_per_hour",
    "mem_util": "efficiency.mem_util",
    "bw_eff": "efficiency.bw_eff",
    "mfu": "efficiency.mfu",
    "min_kv_fraction": "efficiency.min_kv_fraction",
    "ttft_slo": "slo.ttft_s",
    "min_stream_tps": "slo.min_stream_tps",
    "api_usd_per_mtok": "api.usd_per_mtok",
    "fallback_share": "api.fallback_share",
    "budget_usd_year": "budget_usd_year",
    "mix_step": "mix_step",
}
PATH_TO_FLAG = {path: "--" + dest.replace("_", "-") for dest, path in FLAGS.items()} | {
    "models.share": "--mix",
    "models.kv_dtype_bytes": "--kv-dtype-bytes",
    **{
        f"models.{f}": "--model"
        for f in (
            "name",
            "total_params_b",
            "active_params_b",
            "quant",
            "kv_bytes_per_token",
            "layers",
            "kv_heads",
            "head_dim",
        )
    },
}
MODEL_HELP = (
    "NAME:TOTAL_B:ACTIVE_B:QUANT[:KV], KV = bytes per token or LAYERSxKV_HEADSxHEAD_DIM; "
    "repeat for a routing mix (set shares with --mix)"
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Capacity and budget planner: GPUs, cost and a budget verdict."
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), help="start from a reference preset")
    parser.add_argument(
        "--config", metavar="FILE.toml", help="TOML with the fields of --json's `input` (gpu may be a preset name)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--gpu", metavar="PRESET", help=f"one of {', '.join(GPU_PRESETS)}")
    parser.add_argument("--model", action="append", metavar="SPEC", help=MODEL_HELP)
    parser.add_argument("--mix", metavar="NAME=SHARE,...", help="routing shares; must sum to 1")
    parser.add_argument("--kv-dtype-bytes", type=float, help="KV cache bytes per element, all models")
    for dest, path in FLAGS.items():
        kind = int if dest in ("tokens_in", "tokens_out") else float
        parser.add_argument("--" + dest.replace("_", "-"), dest=dest, type=kind, help=path)


def _deep_merge(base: dict[str, Any], layer: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in layer.items():
        if key == "gpu":
            out["gpu"] = _layer_gpu(out.get("gpu", {}), value)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _layer_gpu(base: Any, layer: Any) -> dict[str, Any]:
    # A preset name (string, or `preset` key in a table) replaces the GPU; other keys refine it.
    if isinstance(layer, str):
        layer = {"preset": layer}
    if not isinstance(layer, dict):
        raise PlanError("gpu", "must be a preset name or a table")
    rest = {k: v for k, v in layer.items() if k != "preset"}
    if "preset" not in layer:
        return {**(base if isinstance(base, dict) else {}), **rest}
    name = str(layer["preset"]).upper()
    if name not in GPU_PRESETS:
        raise PlanError("gpu", f"unknown GPU preset {layer['preset']!r}; choose {', '.join(GPU_PRESETS)}")
    return {**GPU_PRESETS[name], **rest}


def _parse_model(spec: str) -> dict[str, Any]:
    parts = spec.split(":")
    if len(parts) not in (4, 5):
        raise PlanError("--model", f"{spec!r}: expected {MODEL_HELP.split(';')[0]}")
    name, total, active, quant = parts[:4]
    try:
        model: dict[str, Any] = {
            "name": name,
            "total_params_b": float(total),
            "active_params_b": float(active),
            "quant": quant.lower(),
        }
        if len(parts) == 5:
            if shape := re.fullmatch(r"(\d+)x(\d+)x(\d+)", parts[4]):
                model.update(zip(("layers", "kv_heads", "head_dim"), map(int, shape.groups()), strict=True))
            else:
                model["kv_bytes_per_token"] = float(parts[4])
    except ValueError as exc:
        raise PlanError("--model", f"{spec!r}: {exc}") from None
    return model


def _apply_models(merged: dict[str, Any], args: argparse.Namespace) -> None:
    if args.model:
        merged["models"] = [_parse_model(s) for s in args.model]
        for m in merged["models"]:
            m["share"] = 1.0 / len(merged["models"])
    models = merged.get("models", [])
    if args.mix:
        shares: dict[str, float] = {}
        for item in args.mix.split(","):
            name, sep, value = item.partition("=")
            try:
                if not sep:
                    raise ValueError(item)
                shares[name.strip()] = float(value)
            except ValueError:
                raise PlanError("--mix", f"{item!r}: expected NAME=SHARE") from None
        known = {m.get("name") for m in models}
        if unknown := set(shares) - known:
            raise PlanError("--mix", f"unknown model(s) {sorted(unknown)}; models: {sorted(known)}")
        for m in models:
            m["share"] = shares.get(m["name"], 0.0)
    if args.kv_dtype_bytes is not None:
        for m in models:
            m["kv_dtype_bytes"] = args.kv_dtype_bytes


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise PlanError("--config", f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PlanError("--config", f"malformed TOML in {path}: {exc}") from None


def build_input(args: argparse.Namespace) -> PlanInput:
    """Scenario ← TOML ← flags, validated into a PlanInput. Raises PlanError."""
    merged: dict[str, Any] = copy.deepcopy(SCENARIOS[args.scenario]) if args.scenario else {}
    if args.config:
        merged = _deep_merge(merged, _read_toml(args.config))
    if args.gpu:
        merged = _deep_merge(merged, {"gpu": args.gpu})
    flags: dict[str, Any] = {}
    for dest, path in FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            *parents, leaf = path.split(".")
            node = flags
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
    merged = _deep_merge(merged, flags)
    _apply_models(merged, args)
    try:
        inp = msgspec.convert(merged, PlanInput)
    except msgspec.ValidationError as exc:
        raise _named(exc, merged) from None
    return check_input(inp)


MISSING = {
    "gpu": "no GPU: pass --gpu, a [gpu] table, or --scenario",
    "models": "no model: pass --model, [[models]] in TOML, or --scenario",
}


def _named(exc: msgspec.ValidationError, merged: dict[str, Any]) -> PlanError:
    # msgspec says "Expected `float` > 0.0 - at `$.load.qps`": name the field, the flag that
    # sets it and the value it got.
    text = str(exc)
    if missing := re.match(r"Object missing required field `(\w+)`$", text):
        name = missing.group(1)
        return PlanError(name, MISSING.get(name, f"required field {name!r} is missing"))
    found = re.search(r" - at `\$\.?(.*)`$", text)
    if not found:
        return PlanError("input", text)
    path, message = found.group(1), text[: found.start()]
    node: Any = merged
    for key in re.findall(r"[^.\[\]]+", path):
        try:
            node = node[int(key)] if isinstance(node, list) else node[key]
        except (KeyError, IndexError, ValueError, TypeError):
            node = None
            break
    if node is not None and not isinstance(node, (dict, list)):
        message += f", got {node!r}"
    flag = PATH_TO_FLAG.get(re.sub(r"\[\d+\]", "", path))
    return PlanError(f"{path} ({flag})" if flag else path, message)


def run(args: argparse.Namespace) -> int:
    try:
        report = build_report(build_input(args))
    except PlanError as exc:
        print(f"laneway plan: error: {exc.param}: {exc.message}", file=sys.stderr)
        return 2
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(report), indent=2).decode())
    else:
        print(render_text(report), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="laneway plan")
    configure(parser)
    try:
        return run(parser.parse_args(argv))
    except BrokenPipeError:  # `... | head`: the reader left; not an error worth a traceback
        sys.stdout = open(os.devnull, "w")  # stops the flush at exit failing too
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""Engine choice for `laneway worker --engine sim|vllm|openai`: flags and construction.

The vllm and openai modules are imported only when chosen, so a sim worker (and the whole
broker side) runs without vLLM installed.
"""

from __future__ import annotations

import argparse

from workers.engine import Engine
from workers.engines.sim.engine import SimEngine
from workers.engines.sim.roofline import PROFILES

ENGINES = ("sim", "vllm", "openai")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", choices=ENGINES, default="sim")
    g = parser.add_argument_group("sim engine (--engine sim; a SIMULATION, labelled as such)")
    g.add_argument("--sim-profile", choices=sorted(PROFILES), default="llama-8b-h100")
    g.add_argument("--sim-speed", type=float, default=1.0, help="run the modelled GPU N× faster")
    g.add_argument("--sim-max-seqs", type=int, default=None)
    g.add_argument("--sim-kv-tokens", type=int, default=None)
    g.add_argument(
        "--sim-max-num-batched-tokens",
        type=int,
        default=None,
        help="tokens per engine step (vLLM's max_num_batched_tokens); default: the profile's",
    )
    g.add_argument(
        "--sim-long-prefill-token-threshold",
        type=int,
        default=None,
        help="most prompt tokens one request computes per step (vLLM's); default: the profile's",
    )
    g.add_argument(
        "--sim-min-step",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="no engine step shorter than this: streams at most 1/SECONDS tok/s at any occupancy",
    )
    g.add_argument(
        "--sim-max-loras",
        type=int,
        default=4,
        help="LoRA adapters the simulated engine holds loaded (the least recently used makes room)",
    )
    g.add_argument(
        "--sim-lora-load-s",
        type=float,
        default=0.2,
        metavar="SECONDS",
        help="what loading an adapter adds to the step that first needs it",
    )


def configure_all(parser: argparse.ArgumentParser) -> None:
    """Flags of every engine (the engine modules import their heavy packages lazily)."""
    configure(parser)
    from workers.engines.openai.config import OpenAIUpstreamConfig
    from workers.engines.vllm.config import VllmConfig

    VllmConfig.configure(parser)
    OpenAIUpstreamConfig.configure(parser)


def build(args: argparse.Namespace) -> Engine:
    if args.engine == "sim":
        return SimEngine(
            PROFILES[args.sim_profile],
            speed=args.sim_speed,
            max_seqs=args.sim_max_seqs,
            kv_tokens=args.sim_kv_tokens,
            max_num_batched_tokens=args.sim_max_num_batched_tokens,
            long_prefill_token_threshold=args.sim_long_prefill_token_threshold,
            min_step_s=args.sim_min_step,
            max_loras=args.sim_max_loras,
            lora_load_s=args.sim_lora_load_s,
        )
    if args.engine == "vllm":
        from workers.engines.vllm.config import VllmConfig
        from workers.engines.vllm.engine import VllmEngine

        return VllmEngine(VllmConfig.from_args(args))
    from workers.engines.openai.config import OpenAIUpstreamConfig
    from workers.engines.openai.engine import OpenAIUpstreamEngine

    return OpenAIUpstreamEngine(OpenAIUpstreamConfig.from_args(args))

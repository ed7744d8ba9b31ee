"""Measure a real GPU's decode step and prefill cost for a Llama-3.1-8B-shaped model, to check the
sim engine's roofline profile (`workers/engines/sim/engine.py`, `llama-8b-h100`) against hardware.

Random weights (no download): the timings depend on shapes and dtype, not on the values. Uses
transformers' Llama in bf16 with SDPA attention and a static-size KV cache built by a prefill;
vLLM's paged kernels are faster, so these are an upper bound on a step's time.

    python tests/gpu/calibrate_sim.py [--json out.json] [--tiny]   (--tiny: a CPU smoke run)

Beside each measurement it prints what the profile predicts with the sim's step-time model
(`workers.engines.sim.roofline.step_seconds`, a roofline): `max(decode_base_s + KV tokens read × kv_s_per_token,
tokens × prefill_s_per_token)`, plus the step a full `max_num_batched_tokens` prefill chunk would
take. The chunk sweep (one forward of M new tokens) shows where the roofline's knee is: flat while
the weight reads dominate, then linear in M.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere


def predicted(profile_name: str, batches: list[int], context: int, chunks: list[int]) -> dict:
    """The sim profile's figures for the same shapes (KV reads scale with the context)."""
    from workers.engines.sim.roofline import PROFILES, step_seconds

    p = PROFILES[profile_name]
    return {
        "profile": p.name,
        "source": p.source,
        "prefill_s_per_token": p.prefill_s_per_token,
        "max_num_batched_tokens": p.max_num_batched_tokens,
        "full_prefill_step_s": step_seconds(p, p.max_num_batched_tokens, p.max_num_batched_tokens),
        "decode": [{"batch": b, "step_s": step_seconds(p, b * context, b)} for b in batches],
        # As the engine charges a lone prompt's chunk: one sequence (the sim counts a
        # reference context's KV read for it, which a fresh prompt does not have).
        "chunk": [{"tokens": m, "step_s": step_seconds(p, m, m)} for m in chunks],
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--tiny", action="store_true", help="a small model on CPU, to check the script")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    p.add_argument("--chunks", type=int, nargs="+", default=[16, 64, 128, 256, 512, 1024, 2048])
    p.add_argument("--profile", default="llama-8b-h100", help="the sim profile to compare against")
    args = p.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    device = "cpu" if args.tiny else "cuda"
    if args.tiny:
        cfg = LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            max_position_embeddings=4096,
        )
        args.batches, args.context, args.chunks = [1, 4], 64, [8, 32]
    else:  # Llama-3.1-8B
        cfg = LlamaConfig(
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            max_position_embeddings=8192,
            rope_theta=500000.0,
        )
    try:
        cfg._attn_implementation = "sdpa"
    except (AttributeError, ValueError):
        pass  # newer transformers pick SDPA by default
    dtype = torch.float32 if args.tiny else torch.bfloat16
    t0 = time.perf_counter()
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    build_s = time.perf_counter() - t0

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def forward_s(ids, repeats: int) -> float:
        """Seconds of one forward over `ids` (no KV cache), after a warm-up."""
        model(ids)
        sync()
        t = time.perf_counter()
        for _ in range(repeats):
            model(ids)
        sync()
        return (time.perf_counter() - t) / repeats

    report: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "params": params,
        "build_s": build_s,
        "context": args.context,
        "decode": [],
        "prefill": {},
    }
    with torch.inference_mode():
        # Prefill: tokens per second of one long prompt.
        ids = torch.randint(0, cfg.vocab_size, (1, 1500 if not args.tiny else 64), device=device)
        report["prefill"] = {"tokens": ids.shape[1], "s_per_token": forward_s(ids, 3) / ids.shape[1]}

        # Chunks: one forward of M new tokens, the knee of the roofline. Eager batch-1 forwards
        # of a few tokens are partly kernel-launch bound (vLLM captures CUDA graphs), so the flat
        # part reads high against the weight-read time.
        chunks = {m: torch.randint(0, cfg.vocab_size, (1, m), device=device) for m in args.chunks}
        report["chunk"] = [{"tokens": m, "step_s": forward_s(ids, 5)} for m, ids in chunks.items()]

        # Decode: one step for B sequences with `context` tokens of KV cache each.
        for b in args.batches:
            ctx = torch.randint(0, cfg.vocab_size, (b, args.context), device=device)
            out = model(ctx, use_cache=True)
            past = out.past_key_values
            nxt = torch.randint(0, cfg.vocab_size, (b, 1), device=device)
            for _ in range(2):  # warm-up steps
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
            sync()
            steps = 10
            t = time.perf_counter()
            for _ in range(steps):
                out = model(nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
            sync()
            step = (time.perf_counter() - t) / steps
            report["decode"].append({"batch": b, "step_s": step, "tokens_per_s": b / step})
            del past, out
            if device == "cuda":
                torch.cuda.empty_cache()
    report["sim_profile"] = predicted(args.profile, args.batches, args.context, args.chunks)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Named GPUs and the two reference scenarios, as plain dicts that TOML and flags layer over.

GPU spec numbers are NVIDIA's published per-GPU figures. Datasheets quote tensor FLOPS with 2:4
structured sparsity; LLM serving runs dense, so the figures below are half the quoted ones.
Prices are ASSUMED rental rates in $/GPU-hour, not quotes: H100 $3.00 is the rate that turns the
cost-stack document's ~16 H100s into its ~$1.2K/day (16 × 24 h × $3 = $1,152) and sits in the
2025-26 post-cut hyperscaler/neocloud range; H200 and B200 scale from it. Override with
--gpu-usd-per-hour or `[gpu] usd_per_hour` in TOML.
"""

from __future__ import annotations

from typing import Any

GPU_PRESETS: dict[str, dict[str, Any]] = {
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5: 80 GB HBM3, 3.35 TB/s;
    # BF16 1,979 / FP8 3,958 TFLOPS with sparsity -> 989.5 / 1,979 dense. No FP4 cores.
    "H100": {
        "name": "H100",
        "memory_gb": 80.0,
        "bandwidth_tbs": 3.35,
        "tflops_bf16": 989.5,
        "tflops_fp8": 1979.0,
        "tflops_fp4": 0.0,
        "usd_per_hour": 3.00,
    },
    # NVIDIA H200 Tensor Core GPU datasheet, SXM: 141 GB HBM3e, 4.8 TB/s; same Hopper tensor
    # cores as H100 (BF16 1,979 / FP8 3,958 TFLOPS with sparsity). No FP4 cores.
    "H200": {
        "name": "H200",
        "memory_gb": 141.0,
        "bandwidth_tbs": 4.8,
        "tflops_bf16": 989.5,
        "tflops_fp8": 1979.0,
        "tflops_fp4": 0.0,
        "usd_per_hour": 3.75,
    },
    # NVIDIA DGX/HGX B200 datasheet, per 8 GPUs: 1,440 GB HBM3e, 64 TB/s, FP4 144 PFLOPS,
    # FP8 72 PFLOPS (sparse) -> per GPU 180 GB, 8 TB/s, 9,000 FP4 / 4,500 FP8 / 2,250 BF16 dense.
    "B200": {
        "name": "B200",
        "memory_gb": 180.0,
        "bandwidth_tbs": 8.0,
        "tflops_bf16": 2250.0,
        "tflops_fp8": 4500.0,
        "tflops_fp4": 9000.0,
        "usd_per_hour": 5.50,
    },
}


def _kv(layers: int, kv_heads: int, head_dim: int) -> dict[str, int]:
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim}


SCENARIOS: dict[str, dict[str, Any]] = {
    # Reference 000: B2B SaaS. The document gives DAU, daily requests (100,000 = 1 per user),
    # 5,000 peak concurrent users, p95 < 1 s, $500k/year; no token counts, so we borrow the
    # cost-stack document's 1.5K in / 400 out. Peak factor 3: traffic in business hours.
    # The 2.4T-A95B model is the document's (hypothetical); its KV shape is our assumption,
    # a wider Qwen3-style GQA stack: 128 layers × 8 KV heads × 128 dims, FP8 KV = 256 KiB/token.
    # The smaller variants are real Qwen3 configs (config.json: layers / KV heads / head_dim).
    "b2b-100k-dau": {
        "name": "b2b-100k-dau",
        "reference": "b2b",
        "budget_usd_year": 500_000.0,
        "load": {
            "dau": 100_000.0,
            "requests_per_user_day": 1.0,
            "peak_factor": 3.0,
            "concurrency": 5000.0,
            "think_time_s": 0.0,
            "tokens_in": 1500,
            "tokens_out": 400,
        },
        "gpu": GPU_PRESETS["B200"],
        "models": [
            {
                "name": "qwen3.8-2.4t-a95b",
                "total_params_b": 2400.0,
                "active_params_b": 95.0,
                "quant": "nvfp4",
                "share": 1.0,
                **_kv(128, 8, 128),
            },
            {
                "name": "qwen3-235b-a22b",
                "total_params_b": 235.0,
                "active_params_b": 22.0,
                "quant": "nvfp4",
                "share": 0.0,
                **_kv(94, 4, 128),
            },
            {
                "name": "qwen3-30b-a3b",
                "total_params_b": 30.5,
                "active_params_b": 3.3,
                "quant": "fp8",
                "share": 0.0,
                **_kv(48, 4, 128),
            },
        ],
        "slo": {"ttft_s": 1.0, "min_stream_tps": 20.0},
        "api": {"usd_per_mtok": 3.0, "fallback_share": 0.0},
    },
    # Reference 004: cost-optimised stack. 120 peak QPS, 1.5K in / 400 out, 70B/8B self-hosted
    # in FP8 (the document's "AWQ/FP8"), 70% routed to 8B, 10% hosted-API fallback at $3/1M,
    # chat TTFT p95 < 800 ms. KV shapes are Llama-3 70B / 8B (80×8×128, 32×8×128), FP8 KV.
    "cost-stack-120qps": {
        "name": "cost-stack-120qps",
        "reference": "cost-stack",
        "load": {"qps": 120.0, "tokens_in": 1500, "tokens_out": 400},
        "gpu": GPU_PRESETS["H100"],
        "models": [
            {
                "name": "llama-70b",
                "total_params_b": 70.0,
                "active_params_b": 70.0,
                "quant": "fp8",
                "share": 0.3,
                **_kv(80, 8, 128),
            },
            {
                "name": "llama-8b",
                "total_params_b": 8.0,
                "active_params_b": 8.0,
                "quant": "fp8",
                "share": 0.7,
                **_kv(32, 8, 128),
            },
        ],
        "slo": {"ttft_s": 0.8, "min_stream_tps": 20.0},
        "api": {"usd_per_mtok": 3.0, "fallback_share": 0.10},
    },
}

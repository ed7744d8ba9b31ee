"""The simulated GPU's step time: a roofline per hardware profile.

A step that reads `kv_tokens` tokens of KV cache (each scheduled sequence's context: what it has
computed plus what the step adds) and processes `tokens` tokens lasts

    max(decode_base_s + kv_tokens × kv_s_per_token,  tokens × prefill_s_per_token)

the longer of reading the weights once plus each scheduled sequence's KV cache (memory) and
computing 2 × params FLOPs for each token the step processes (compute; cached prefix blocks
are not processed). The profiles derive their constants from published hardware figures.
"""

from __future__ import annotations

from dataclasses import dataclass

# NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3, 989 TFLOPS dense BF16, 1,979 TFLOPS dense FP8, 80 GB.
_H100_BW, _H100_BF16, _H100_FP8, _H100_MEM = 3.35e12, 989e12, 1979e12, 80e9
_BW_EFF, _MFU = 0.7, 0.5  # achieved fractions typical of vLLM decode / prefill
_CTX = 1900  # the reference documents' context (1.5K in + 400 out): `decode_s_per_seq`'s


@dataclass(frozen=True)
class SimProfile:
    name: str
    prefill_s_per_token: float
    decode_base_s: float
    kv_s_per_token: float  # reading one token's KV cache (K and V, every layer)
    max_seqs: int
    kv_tokens: int
    source: str
    max_num_batched_tokens: int = 8192  # vLLM's default on ≥ 70 GiB GPUs but A100 (OpenAI server)
    long_prefill_token_threshold: int = 0  # vLLM's default: a prompt may take the whole budget

    @property
    def decode_s_per_seq(self) -> float:
        """A sequence's KV read at the reference context: sizing at the reference shape."""
        return _CTX * self.kv_s_per_token


def _roofline(
    name: str, params: float, weight_bytes: float, kv_bytes_per_token: float, gpus: int, peak_flops: float, source: str
) -> SimProfile:
    bw = _H100_BW * gpus * _BW_EFF
    return SimProfile(
        name=name,
        prefill_s_per_token=2 * params / (peak_flops * gpus * _MFU),
        decode_base_s=weight_bytes / bw,
        kv_s_per_token=kv_bytes_per_token / bw,
        # vLLM 0.32 defaults max_num_seqs to 1024 on H100 (engine/arg_utils.py:get_batch_defaults);
        # 256 is its older default. Either way KV binds first: ~225 (8B) / ~118 (70B) sequences
        # at the reference context fit, so the slot count only matters for short contexts.
        max_seqs=256,
        kv_tokens=int((_H100_MEM * gpus * 0.9 - weight_bytes) / kv_bytes_per_token),
        source=source,
    )


def step_seconds(p: SimProfile, kv_tokens: int, tokens: int) -> float:
    """One step on the profile's GPU: the GPU overlaps the memory reads and the arithmetic, so
    the step lasts the longer of the two, not their sum. A decode step is memory-bound: the
    weights once, and each sequence's KV cache as long as its context (PagedAttention reads every
    block of it), so short conversations make short steps. The prefill tokens packed into it cost
    nothing until their FLOPs outlast the reads; that is what vLLM's chunked prefill relies on
    ("locating compute-bound (prefill) and memory-bound (decode) requests to the same batch",
    its docs). A large chunk makes the step compute-bound. `tests/gpu/calibrate_sim.py` measures
    the knee on a GPU."""
    return max(p.decode_base_s + kv_tokens * p.kv_s_per_token, tokens * p.prefill_s_per_token)


PROFILES: dict[str, SimProfile] = {
    # Llama-3.1-8B, BF16, 1×H100: 16 GB weights; KV 32 layers × 8 kv-heads × 128 × 2 (K,V) × 2 B = 128 KiB/token.
    "llama-8b-h100": _roofline(
        "llama-8b-h100",
        8.0e9,
        16.0e9,
        131_072,
        1,
        _H100_BF16,
        "H100 SXM datasheet (3.35 TB/s, 989 TFLOPS BF16); Llama-3.1-8B config; 70% bandwidth, 50% MFU",
    ),
    # Llama-3.1-70B, FP8 weights, TP=2 on 2×H100: 70 GB weights; KV 80 layers × 8 × 128 × 2 × 2 B = 320 KiB/token.
    "llama-70b-fp8-2xh100": _roofline(
        "llama-70b-fp8-2xh100",
        70.6e9,
        70.6e9,
        327_680,
        2,
        _H100_FP8,
        "H100 SXM datasheet (3.35 TB/s, 1979 TFLOPS FP8) ×2 (TP=2); Llama-3.1-70B config; 70% bandwidth, 50% MFU",
    ),
    # No GPU time at all: isolates Laneway's own overhead in benchmarks.
    "zero": SimProfile(
        "zero", 0.0, 0.0, 0.0, 4096, 1 << 40, "no delays: overhead measurements only", max_num_batched_tokens=1 << 30
    ),
}

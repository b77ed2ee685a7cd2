"""Model and GPU presets: the numbers the cost model is made of. Registries, not if/elif.

Sources: model configs from the models' config.json (layers, KV heads, head dim, and
`max_position_embeddings` as the context: Llama-3.1-8B/70B 131,072; Qwen2.5-7B(-Instruct) 32,768,
YaRN off as shipped; the Qwen3 2507 releases 262,144 native, below; `tiny` is no real model and
takes Llama's); GPU peaks from
vendor datasheets (dense BF16 tensor FLOPs, HBM bandwidth) and PCIe link rates. `link_bytes_per_s`
is an achievable host<->device copy rate for pinned memory (about 85 % of the PCIe theoretical).
"""

from __future__ import annotations

from dataclasses import dataclass

from tierdiag.errors import unknown_name


@dataclass(frozen=True)
class ModelPreset:
    """A model's shape: what its KV cache and its compute cost a token."""

    name: str
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    # The model's maximum context (config.json `max_position_embeddings`, SGLang's
    # `model_config.context_len`): a longer request is rejected (scheduler: context_length).
    max_context_tokens: int
    dtype_bytes: int = 2
    # A mixture of experts: `num_params` is what one token computes with (the active parameters:
    # the cost model's 2 x params FLOPs a token), `total_params` what sits in GPU memory (every
    # expert: the weights beside the KV pool, and what a decode step reads). None: a dense model.
    total_params: float | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, every layer, every KV head.
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return (self.total_params or self.num_params) * self.dtype_bytes


@dataclass(frozen=True)
class GpuPreset:
    """A GPU's memory, peak rates and host link, as the cost model reads them."""

    name: str
    memory_bytes: float
    flops_per_s: float  # dense BF16 peak
    hbm_bytes_per_s: float
    link_bytes_per_s: float  # host<->device achievable, per direction
    link_desc: str
    transfer_overhead_ns: int = 10_000  # per copy launch (kernel/DMA set-up, sync)
    mfu: float = 0.6  # fraction of peak a good prefill kernel reaches


MODELS: dict[str, ModelPreset] = {
    m.name: m
    for m in (
        ModelPreset("llama3-8b", num_layers=32, hidden_size=4096, num_kv_heads=8, head_dim=128, num_params=8.03e9,
                    max_context_tokens=131_072),
        ModelPreset("llama3-70b", num_layers=80, hidden_size=8192, num_kv_heads=8, head_dim=128, num_params=70.6e9,
                    max_context_tokens=131_072),
        ModelPreset("qwen2.5-7b", num_layers=28, hidden_size=3584, num_kv_heads=4, head_dim=128, num_params=7.62e9,
                    max_context_tokens=32_768),
        # Long-context open models (>= 200k tokens native), from their Hugging Face config.json.
        # All are GQA with head_dim 128 and full attention on every layer, so the KV layout is the
        # one above: 2 (K, V) x layers x KV heads x head_dim x 2 B. MLA models (DeepSeek-V3, Kimi K2)
        # cache one compressed latent a layer instead and are left out rather than mis-sized.
        # Qwen/Qwen3-4B-Instruct-2507: hidden_size 2560, num_hidden_layers 36, num_attention_heads 32,
        # num_key_value_heads 8, head_dim 128, max_position_embeddings 262144; 4.0B parameters.
        # KV 147,456 B/token.
        ModelPreset("qwen3-4b", num_layers=36, hidden_size=2560, num_kv_heads=8, head_dim=128, num_params=4.02e9,
                    max_context_tokens=262_144),
        # Qwen/Qwen3-30B-A3B-Instruct-2507 (qwen3_moe): hidden_size 2048, num_hidden_layers 48,
        # num_attention_heads 32, num_key_value_heads 4, head_dim 128, max_position_embeddings 262144;
        # 128 experts, 8 routed a token (moe_intermediate_size 768): 30.5B parameters, 3.3B active.
        # KV 98,304 B/token; BF16 weights 61 GB leave an H200 most of its memory for KV.
        ModelPreset("qwen3-30b-a3b", num_layers=48, hidden_size=2048, num_kv_heads=4, head_dim=128,
                    num_params=3.3e9, total_params=30.5e9, max_context_tokens=262_144),
        # Qwen/Qwen3-Coder-30B-A3B-Instruct: the same shape as Qwen3-30B-A3B (48 layers, 4 KV heads of
        # 128, 128 experts / 8 active), max_position_embeddings 262144: the agentic-coding model.
        ModelPreset("qwen3-coder-30b-a3b", num_layers=48, hidden_size=2048, num_kv_heads=4, head_dim=128,
                    num_params=3.3e9, total_params=30.5e9, max_context_tokens=262_144),
        ModelPreset("tiny", num_layers=4, hidden_size=256, num_kv_heads=2, head_dim=32, num_params=20e6,
                    max_context_tokens=131_072),
    )
}

GPUS: dict[str, GpuPreset] = {
    g.name: g
    for g in (
        GpuPreset("h200", 141e9, 989e12, 4.8e12, 55e9, "PCIe Gen5 x16"),
        GpuPreset("h100", 80e9, 989e12, 3.35e12, 55e9, "PCIe Gen5 x16"),
        GpuPreset("a100", 80e9, 312e12, 2.0e12, 27e9, "PCIe Gen4 x16"),
        GpuPreset("l40s", 48e9, 362e12, 0.864e12, 27e9, "PCIe Gen4 x16"),
        # A CPU "device": memcpy-class link, modest compute. For runs with no accelerator at all.
        GpuPreset("cpu", 64e9, 2e12, 0.1e12, 14e9, "host memcpy", transfer_overhead_ns=2_000, mfu=0.5),
    )
}


def model_preset(name: str) -> ModelPreset:
    try:
        return MODELS[name]
    except KeyError:
        raise unknown_name("model preset", name, MODELS) from None


def gpu_preset(name: str) -> GpuPreset:
    try:
        return GPUS[name]
    except KeyError:
        raise unknown_name("gpu preset", name, GPUS) from None

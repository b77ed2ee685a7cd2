"""Model and GPU presets: the numbers the cost model is made of. Registries, not if/elif.

Sources: model configs from the models' config.json (layers, KV heads, head dim, and
`max_position_embeddings` as the context: Llama-3.1-8B/70B 131,072; Qwen2.5-7B(-Instruct) 32,768,
YaRN off as shipped; `tiny` is no real model and takes Llama's); GPU peaks from
vendor datasheets (dense BF16 tensor FLOPs, HBM bandwidth) and PCIe link rates. `link_bytes_per_s`
is an achievable host<->device copy rate for pinned memory (about 85 % of the PCIe theoretical).
"""

from __future__ import annotations

from dataclasses import dataclass

from tierdiag.errors import unknown_name


@dataclass(frozen=True)
class ModelPreset:
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

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, every layer, every KV head.
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True)
class GpuPreset:
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

"""Public model architectures as data: what their KV cache and their prefill cost depend on.

Each :class:`Architecture` is one published ``config.json``, field for field (its ``source``
names it); ``tensor_parallel`` is a deployment choice, not part of the model, and divides the
attention heads, KV heads and MLP width per GPU as Megatron-style tensor parallelism does.

KV bytes per token and GPU = 2 (K and V) x layers x KV heads per GPU x head size x dtype bytes;
a sliding-window model keeps at most ``sliding_window`` tokens of it per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

HF = "https://huggingface.co"


@dataclass(frozen=True)
class Architecture:
    name: str
    source: str  # the published config.json every figure below comes from
    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int  # hidden_size / num_attention_heads (or head_dim where given)
    ffn: int  # intermediate_size (SwiGLU: gate and up of this width, down back to hidden)
    vocab: int  # vocab_size
    dtype_bytes: int  # torch_dtype bfloat16: 2
    sliding_window: int | None = None  # sliding_window; None: full attention in every layer
    tensor_parallel: int = 1

    def __post_init__(self) -> None:
        for f in ("heads", "kv_heads", "ffn"):
            if getattr(self, f) % self.tensor_parallel:
                raise ValueError(f"{self.name}: {f} ({getattr(self, f)}) is not divisible by "
                                 f"tensor_parallel {self.tensor_parallel}")

    @property
    def heads_per_gpu(self) -> int:
        return self.heads // self.tensor_parallel

    @property
    def kv_heads_per_gpu(self) -> int:
        return self.kv_heads // self.tensor_parallel

    @property
    def ffn_per_gpu(self) -> int:
        return self.ffn // self.tensor_parallel

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes on one GPU, every layer."""
        return 2 * self.layers * self.kv_heads_per_gpu * self.head_dim * self.dtype_bytes

    def with_tensor_parallel(self, tp: int) -> Architecture:
        return replace(self, name=f"{self.name.split('-tp')[0]}-tp{tp}", tensor_parallel=tp)


LLAMA_3_8B = Architecture(
    "llama-3-8b", f"{HF}/meta-llama/Meta-Llama-3-8B/blob/main/config.json",
    layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256,
    dtype_bytes=2)
LLAMA_3_70B = Architecture(
    "llama-3-70b", f"{HF}/meta-llama/Meta-Llama-3-70B/blob/main/config.json",
    layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, ffn=28672, vocab=128256,
    dtype_bytes=2)
MISTRAL_7B = Architecture(
    "mistral-7b-v0.1", f"{HF}/mistralai/Mistral-7B-v0.1/blob/main/config.json",
    layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=32000,
    dtype_bytes=2, sliding_window=4096)

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    LLAMA_3_8B, LLAMA_3_70B.with_tensor_parallel(8), MISTRAL_7B)}


def architecture(name: str) -> Architecture:
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}") from None

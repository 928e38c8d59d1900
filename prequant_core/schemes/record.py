"""What one quantization scheme is, in one record: every other module asks the registry for these fields instead of
knowing scheme names itself (docs/FORMAT.md section 4 has the values, Unsloth's builder the rules)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..scheme_names import WEIGHT_ONLY_TAIL  # noqa: F401 (public name)


@dataclasses.dataclass(frozen=True)
class Scheme:
    name: str  # what a file's metadata records and the nodes list: "int8"
    kind: str  # what its weights are in memory (qtensor.kind_of): "int8" | "float8" | "nvfp4" | "mxfp8"
    codec: Any  # its weight kind's layout (codec.Codec): parts, checks, JSON, matmul; shared by schemes of one kind
    suffix: str  # repo and file-name token: unsloth/Z-Image-Turbo-FP8, <Model>-FP8.safetensors
    config: Callable[[bool], Any]  # (weight_only) -> the exact torchao config the scheme stands for
    quantize: Callable[[Any, Any], Any]  # (bf16 weight, that config) -> the quantized weight quantize_() would make
    # Unsloth's builder rules, recorded in every file and checked on load
    require_bf16: bool = False
    require_divisible: int = 0
    granularity_field: str | None = None  # the metadata field naming its scale granularity
    granularity: str | None = None  # the value Unsloth's builder records there and its loader requires
    fast_accum: bool | None = None
    exclude_base_tokens: tuple[str, ...] = ()  # layer-name tokens it keeps dense on every family (+ family extras)
    block_size: int = 0  # per-block scales along the input dim; 0: one scale per row
    weight_only: bool = False  # files may record "<name>-weight-only": weights quantized, activations not
    suffix_holds: tuple[str, ...] = ()  # what a repo with this suffix holds, in the order tried (default: the scheme)
    legacy_pt: bool = False  # old Unsloth releases published it as transformer_<name>.pt
    containers: tuple[str, ...] | None = None  # the containers the builder writes it to (None: every one)
    comfy_format: str | None = None  # the ComfyUI-native format name holding it (formats/comfy_layout.py)
    min_capability: tuple[int, int] | None = None  # CUDA compute capability of its quantized-matmul kernels

    def names(self) -> tuple[str, ...]:
        return (self.name, self.name + WEIGHT_ONLY_TAIL) if self.weight_only else (self.name,)

    def label(self, weight_only: bool = False) -> str:
        return self.name + (WEIGHT_ONLY_TAIL if weight_only else "")

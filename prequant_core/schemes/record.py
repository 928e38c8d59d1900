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
    # ComfyUI's own formats holding its weights (native_layout.ComfyLayout: storage, side tensors, first ComfyUI
    # release, and the module's functions both ways); the first is what the builder writes
    comfy_layouts: tuple = ()
    twin_leads: bool = False  # Unsloth's -ComfyUI twin holds the artifact's weights bit for bit: tried before it
    convrot_file: bool = False  # hosted repos may hold its ConvRot build, <Model><SUFFIX>-ConvRot.safetensors, first
    file_rules: tuple = ()  # metadata blocks its files may declare, with their checks (file_rules.FileRule)
    # (tensors) -> (reasons, notes): rules on the settings its weights record (fp8: the activation floor)
    check_loaded: Callable[[dict], tuple[list, list]] | None = None
    # (tensors) -> how many weights changed: the settings Unsloth's loader pins on its weights (fp8: TORCH kernels)
    pin_loaded: Callable[[dict], int] | None = None
    min_capability: tuple[int, int] | None = None  # CUDA compute capability of its quantized-matmul kernels

    @property
    def comfy_format(self) -> str | None:
        """The ComfyUI-native format the builder writes it in (its first layout), or None."""
        return self.comfy_layouts[0].name if self.comfy_layouts else None

    def names(self) -> tuple[str, ...]:
        return (self.name, self.name + WEIGHT_ONLY_TAIL) if self.weight_only else (self.name,)

    def label(self, weight_only: bool = False) -> str:
        return self.name + (WEIGHT_ONLY_TAIL if weight_only else "")

"""The quantized Linear inside a ComfyUI model.

Weights are stored as plain tensors: ``weight`` (codes, rows first) and ``weight_scale`` (per-row [out, 1], or
per-block for nvfp4 / mxfp8), plus ``weight_scale_2`` (the row scale) for nvfp4 (``qtensor.parts``), which
ComfyUI can move, size (real bytes), back up and offload like any other parameter. The torchao tensor is
rebuilt around them per call (metadata only, no copy), so the matmul is torchao's, identical to a model quantized
in place. ComfyUI's cast path (``cast_bias_weight``) would call ``weight.to(dtype)`` and dequantize nowhere, so a
quantized Linear takes its own forward; dense layers keep ComfyUI's.

Which matmul runs (torchao's quantized one, or weight-only: rows dequantized to the compute dtype, then a dense
``F.linear``) is decided at load for the device the model computes on (``prequant_core.schemes.devices``,
docs/FORMAT.md section 8) and stored on each Linear, so sampling never meets an unsupported kernel.
"""
from __future__ import annotations

import torch

from prequant_core.schemes import devices, qtensor, registry, rotation


def spec_is_dynamic(spec) -> bool:
    return spec.dynamic


PART_NAMES = ("weight", "weight_scale", "weight_scale_2")


def choose_matmul(module: torch.nn.Module, device) -> list:
    """Decide the matmul path of every quantized Linear in ``module`` for ``device`` (the load device) and store it
    on each Linear. Returns the distinct choices (``devices.MatmulChoice``), for the node's text."""
    dev = devices.describe(device)
    override = devices.override_from_env()
    choices: dict = {}
    for m in module.modules():
        spec = getattr(m, "prequant_spec", None)
        if spec is None:
            continue
        key = (spec.kind, spec_is_dynamic(spec))
        if key not in choices:
            choices[key] = devices.choose(spec.kind, key[1], dev, override)
        m.prequant_matmul = choices[key].path
        if m.prequant_matmul == devices.QUANTIZED and not registry.codec(spec.kind).runs_quantized(
                m.prequant_parts(), spec):
            m.prequant_matmul = devices.WEIGHT_ONLY  # e.g. e5m2 fp8 codes, fused NVFP4 rows with different scales
        if choices[key].codes_as_bytes:
            m.prequant_keep_bytes()
    return list(choices.values())


def matmul_summary(choices) -> str | None:
    """One line for the node: which matmul runs and why."""
    if not choices:
        return None
    return "; ".join(c.text() for c in choices)


def set_quantized(module: torch.nn.Module, attr: str, t) -> None:
    if attr != "weight" or not hasattr(module, "prequant_assign"):
        raise TypeError(f"a quantized tensor arrived for {type(module).__name__}.{attr}; only Linear weights are")
    tensors, spec = qtensor.parts(t)
    module.prequant_assign(tensors, spec)


def make_ops(base):
    """ComfyUI operations class = ``base`` (what ComfyUI would pick) with a Linear that also runs quantized."""
    import comfy.ops

    class PrequantOps(base):
        class Linear(base.Linear):
            _load_from_state_dict = _own_state_dict_loader(base.Linear)
            prequant_spec = None
            prequant_matmul = None  # devices.QUANTIZED / devices.WEIGHT_ONLY, set at load by choose_matmul
            prequant_bytes = False  # fp8 codes held as uint8 (a device without a float8 dtype)
            prequant_fused_from = None  # the memory-mapped weights this fused weight's rows were copied from, in order
            prequant_fused_file = None  # the file they are mapped from
            prequant_stale = None  # that file, once it changed under a LoRA's backup (nodes/patcher.py): never runs

            def prequant_parts(self, device=None) -> tuple:
                ts = tuple(getattr(self, n) for n in PART_NAMES[:self.prequant_nparts])
                return ts if device is None else tuple(t.to(device, non_blocking=True) for t in ts)

            prequant_nparts = 2

            def prequant_keep_bytes(self):
                """Hold fp8 codes as their raw bytes from now on (same storage, a uint8 view)."""
                self.prequant_bytes = True
                self.prequant_assign(self.prequant_parts(), self.prequant_spec)

            def prequant_typed(self, q):
                """The codes with their real dtype (CPU / CUDA only when kept as bytes)."""
                return registry.codec(self.prequant_spec.kind).typed_codes(q, self.prequant_table)

            prequant_table = None  # the codec's decode table for these codes (e.g. ComfyUI-native float8_e5m2)

            def prequant_requantize(self, dense, like=None, keep=None) -> tuple:
                """``dense`` quantized like this layer's weight (``qtensor.quantize_parts``; on the CPU for
                bytes-kept fp8 codes: torchao's fp8 needs a float8 dtype)."""
                spec = self.prequant_spec
                if not self.prequant_bytes:
                    return qtensor.quantize_parts(dense, spec, like, keep)
                out = qtensor.quantize_parts(dense.cpu(), spec, like, keep)
                return (out[0].view(torch.uint8).to(dense.device), *(p.to(dense.device) for p in out[1:]))

            def prequant_assign(self, tensors, spec):
                tensors = tuple(tensors)
                # which codes they are (which float8): their dtype, or the spec where they are bytes (set here, so
                # a LoRA's requantized weight is read as what it now is)
                self.prequant_table = registry.codec(spec.kind).code_table(tensors[0].dtype, spec)
                if self.prequant_bytes and tensors[0].dtype != torch.uint8:
                    tensors = (tensors[0].view(torch.uint8),) + tensors[1:]
                # New Parameters, never in-place writes: ModelPatcher backups keep pointing at the originals.
                for name, t in zip(PART_NAMES, tensors):
                    self._parameters[name] = torch.nn.Parameter(t, requires_grad=False)
                for name in PART_NAMES[len(tensors):]:
                    self._parameters.pop(name, None)
                self.prequant_nparts = len(tensors)
                self.prequant_spec = spec

            def prequant_quantize_dense(self, dense, old, same=None) -> tuple:
                """``dense`` (rows of the weight as the layer's math sees it) quantized like ``old``, the parts of the
                same rows; rows marked in ``same`` keep ``old``'s codes and scales."""
                spec = self.prequant_spec
                if spec.rotation:
                    dense = rotation.rotate(dense.to(torch.float32), spec.rotation)
                # unchanged rows keep their per-row side values (NVFP4's row scale), changed rows get fresh ones
                new = self.prequant_requantize(dense, old if same is not None else None, same)
                if same is not None and bool(same.any()):
                    keep = same[:, None].to(new[0].device)
                    # byte views: where() has no float8 kernels on every device
                    new = tuple(torch.where(keep, o.to(n.device).view(torch.uint8), n.view(torch.uint8)).view(n.dtype)
                                if n.element_size() == 1 else torch.where(keep, o.to(n.device), n)
                                for o, n in zip(old, new))
                return new

            def prequant_patched_per_call(self, ts) -> tuple:
                """The streamed parts ``ts`` with ComfyUI's low-VRAM weight functions applied. Where each is a
                ``LowVramPatch`` (the LoRA of this weight), its patches go through the same block-by-block path as a
                merged LoRA (``lora_rows.patched_parts``): a block's float32 copy at a time, and the very codes the
                merge would store, so a low-VRAM run with a LoRA gives the full load's output. Any other function gets
                the dense weight as ComfyUI would hand it, which is then requantized."""
                from . import lora_rows
                fs = self.prequant_weight_functions()
                if all(_plain_low_vram_patch(f) for f in fs):
                    patches = [p for f in fs for p in f.patches[f.key]]
                    return lora_rows.patched_parts(self, ts, patches, fs[0].key, give_back_pages=False)
                spec = self.prequant_spec
                w = qtensor.dequantize_parts(ts, spec, spec.dtype)
                for f in fs:
                    w = f(w)
                return self.prequant_requantize(w, ts)

            def prequant_weight_functions(self) -> list:
                """What ComfyUI asks to run on the weight per call: its ``weight_function`` list and, where
                DynamicVRAM loaded the model (ComfyUI 0.15+), the LoRA it attaches as ``weight_lowvram_function``
                instead (ComfyUI's own cast path runs it; this forward must, or the LoRA is silently dropped)."""
                lv = getattr(self, "weight_lowvram_function", None)
                return ([lv] if lv is not None else []) + list(self.weight_function)

            def prequant_bias_functions(self) -> list:
                lv = getattr(self, "bias_lowvram_function", None)
                return ([lv] if lv is not None else []) + list(self.bias_function)

            prequant_vbar_failed = False  # DynamicVRAM's cast refused this layer once: its codes are copied instead

            def prequant_stream(self, input, bias_dtype):
                """Under DynamicVRAM (ComfyUI 0.15+ on CUDA) a streamed layer's codes come through ComfyUI's own
                cast, the ``cast_bias_weight(offloadable=True)`` / ``uncast_bias_weight`` contract its layers use, so
                they stay resident in its VRAM bar between steps instead of being copied on every call. Asked for in
                the codes' own dtype, ComfyUI moves the bytes as they are; the weight's LoRA functions are hidden from
                it for that call (ComfyUI would run them on the raw codes; the forward applies them to the quantized
                weight itself). Returns (codes, bias with its functions applied, ComfyUI's handle), or None where the
                layer is not streamed by DynamicVRAM (no ``_v``) or the cast failed once (logged; then copied)."""
                if getattr(self, "_v", None) is None or self.prequant_vbar_failed:
                    return None
                hidden = self.weight_function, getattr(self, "weight_lowvram_function", None)
                self.weight_function, self.weight_lowvram_function = [], None
                try:
                    return comfy.ops.cast_bias_weight(self, input, dtype=self.weight.dtype, device=input.device,
                                                      bias_dtype=bias_dtype, offloadable=True)
                except Exception as e:  # noqa: BLE001 - ComfyUI's allocator is not testable without CUDA here
                    self.prequant_vbar_failed = True
                    import logging
                    logging.getLogger("prequant").warning(
                        "[prequant] DynamicVRAM's cast did not take a quantized layer (%s: %s); its codes are copied "
                        "to the device on each call instead (same output, more transfer).", type(e).__name__,
                        str(e)[:200])
                    return None
                finally:
                    self.weight_function, self.weight_lowvram_function = hidden

            def forward(self, input, *args, **kwargs):
                spec = self.prequant_spec
                if spec is None:
                    return super().forward(input, *args, **kwargs)
                if self.prequant_stale is not None:
                    raise stale_error(self.prequant_stale)
                comfy.ops.run_every_op()
                dev = input.device
                layout = registry.codec(spec.kind)
                path = self.prequant_matmul
                if path is None:  # built outside the loader: decide once, for the device it first runs on
                    self.prequant_matmul = path = devices.choose(spec.kind, spec_is_dynamic(spec),
                                                                 devices.describe(dev),
                                                                 devices.override_from_env()).path
                bias_dtype = input.dtype if path == devices.WEIGHT_ONLY else spec.dtype
                ts = self.prequant_parts()
                streamed = self.prequant_stream(input, bias_dtype) if ts[0].device != dev else None
                try:
                    if streamed is not None:
                        ts, bias = (streamed[0], *(t.to(dev, non_blocking=True) for t in ts[1:])), streamed[1]
                    else:
                        if ts[0].device != dev:  # low-VRAM streaming: only the codes travel
                            ts = tuple(t.to(dev, non_blocking=True) for t in ts)
                        bias, functions = self.bias, self.prequant_bias_functions()
                        if bias is not None:
                            # ComfyUI's LowVramPatch adds a LoRA's diff_b in place: on a copy, never the layer's
                            # own bias (as ComfyUI's cast_bias_weight copies a bias that has functions)
                            bias = bias.to(device=dev, dtype=bias_dtype, copy=bool(functions))
                            for f in functions:
                                bias = f(bias)
                    if self.prequant_weight_functions():
                        # LoRA in low-VRAM mode or under DynamicVRAM: patched per call
                        ts = self.prequant_patched_per_call(ts)
                    if spec.rotation:
                        input = rotation.rotate(input, spec.rotation)
                    if path == devices.WEIGHT_ONLY:
                        return layout.weight_only_linear(input, ts, spec, bias, self.prequant_table)
                    if layout.float8_codes:
                        ts = (self.prequant_typed(ts[0]), *ts[1:])
                    return layout.quantized_linear(input.to(spec.dtype), ts, spec, bias).to(input.dtype)
                finally:
                    if streamed is not None:  # ComfyUI's buffer is free again once this call's work is queued
                        comfy.ops.uncast_bias_weight(self, *streamed)

    for name, op in _ops_classes(base).items():
        if name != "Linear":  # the other layer classes built eagerly too (see _own_state_dict_loader)
            setattr(PrequantOps, name, type(op)(name, (op,), {"_load_from_state_dict": _own_state_dict_loader(op),
                                                          "__module__": __name__}))
    PrequantOps.__name__ = f"PrequantOps_{base.__name__}"
    return PrequantOps


def _ops_classes(base) -> dict:
    """The layer classes of a ComfyUI operations class (its own and inherited), by name."""
    out: dict = {}
    for klass in reversed(base.__mro__):
        for name, v in vars(klass).items():
            if isinstance(v, type) and issubclass(v, torch.nn.Module) and hasattr(v, "_load_from_state_dict"):
                out[name] = getattr(base, name)
    return out


def _own_state_dict_loader(op):
    """``op``'s state-dict loader, declared as the class's own. With DynamicVRAM on (ComfyUI 0.15+,
    ``comfy.memory_management.aimdo_enabled``) ComfyUI builds its layers with no weight at all until its own loader
    fills them, unless a class brings its own loader; the pack places the file's tensors itself (on a ``meta``
    skeleton), so its layers declare one and are built with their parameters on meta, as on every other ComfyUI."""
    def _load_from_state_dict(self, *args, **kwargs):
        return op._load_from_state_dict(self, *args, **kwargs)
    return _load_from_state_dict


def _plain_low_vram_patch(f) -> bool:
    """ComfyUI's ``LowVramPatch`` of a weight with no conversion around it (both versions: key, patches)."""
    import comfy.model_patcher
    return (isinstance(f, comfy.model_patcher.LowVramPatch) and isinstance(getattr(f, "patches", None), dict)
            and getattr(f, "key", None) in f.patches and getattr(f, "convert_func", None) is None
            and getattr(f, "set_func", None) is None)


def stale_error(path: str):
    """A layer whose checkpoint changed on disk under its LoRA's backup (nodes/patcher.py) holds neither the file's
    weight nor the patched one it was restored to: the model is dropped, and the loader reads the file again."""
    from prequant_core.errors import CorruptCheckpointError
    return CorruptCheckpointError(
        "The checkpoint file changed on disk while its model was loaded with a LoRA: the layers the LoRA patched "
        "could not be restored from it, so this model no longer matches any file and is not run.", path=path,
        expected="the file as it was when the model was loaded", found="the file changed (rewritten or truncated)",
        fix="Queue the prompt again: Load Prequant Transformer then reads and judges the file anew. Do not overwrite "
            "a checkpoint ComfyUI has loaded.")


def is_prequant_linear(m) -> bool:
    return getattr(m, "prequant_spec", None) is not None

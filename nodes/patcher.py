"""A ModelPatcher that lets stock LoRA nodes patch quantized Linears: dequantize -> ComfyUI's own
``calculate_weight`` -> requantize per row, with the original codes *and* scales backed up, so unpatching
restores the quantized weight exactly."""
from __future__ import annotations

import collections

import torch

import comfy.lora
import comfy.model_patcher
import comfy.utils

from prequant_core.families import pages
from prequant_core.schemes import qtensor

from .ops import PART_NAMES, is_prequant_linear

_Backup = collections.namedtuple("Dimension", ["weight", "inplace_update"])


class PrequantModelPatcher(comfy.model_patcher.ModelPatcher):
    def _prequant_op(self, key):
        mod_name, _, attr = key.rpartition(".")
        if attr != "weight" or not mod_name:
            return None
        try:
            op = comfy.utils.get_attr(self.model, mod_name)
        except AttributeError:
            return None
        return op if is_prequant_linear(op) else None

    def patch_weight_to_device(self, key, device_to=None, inplace_update=False):
        op = self._prequant_op(key) if key in self.patches else None
        if op is None:
            return super().patch_weight_to_device(key, device_to=device_to, inplace_update=inplace_update)
        # Tensors made here outlive this call's inference mode (unpatch may run outside it): make them normal.
        with torch.inference_mode(False), torch.no_grad():
            fresh = key not in self.backup
            originals = op.prequant_parts()
            if fresh:
                # every part under its own name (weight, weight_scale, weight_scale_2): unpatch restores them all
                for name, t in zip(PART_NAMES, originals):
                    self.backup[key[:-len("weight")] + name] = _Backup(t, False)
            # One float32 copy of the layer: patched in place, then compared with the stored weight a few rows at a
            # time (the rows the patch left alone keep their codes), then requantized.
            parts = op.prequant_parts(device_to)  # moved to the device once, for the dense copy and the comparison
            out = comfy.lora.calculate_weight(self.patches[key],
                                              qtensor.dense_from_parts(parts, op.prequant_spec, torch.float32), key)
            same = qtensor.rows_unchanged(out, parts, op.prequant_spec)
            del parts
            op.prequant_assign_dense(out, same=same)
            del out
            if fresh:
                # the originals now live only in the backup: where they are the checkpoint file's own pages, give
                # those back (re-read from the file, byte for byte, when unpatch puts them back in use)
                pages.release(originals)

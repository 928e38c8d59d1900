"""prequant_core/formats/fingerprint.py: a weight that carries the origin a legacy reader left (its nested levels
hashed; a nested level with no parts is not covered rather than an error), a fingerprint whose 'modules' is not an
object, where remembered passes go without PREQUANT_VERIFIED_DIR (XDG_CACHE_HOME, else ~/.cache), and a marker owned
by another user that is never believed. Core tier: no ComfyUI."""
from __future__ import annotations

import hashlib
import os

import pytest
import torch

from prequant_core import schemes
from prequant_core.formats import fingerprint


def test_a_weights_recorded_origin_is_what_is_hashed():
    w = schemes.quantize_weight(torch.randn(8, 32).to(torch.bfloat16), "int8")
    own = fingerprint.of_tensor(w)
    codes = torch.arange(6, dtype=torch.int8).reshape(2, 3)
    nested = ("LinearActivationQuantizedTensor",
              (("original_weight_tensor", ("AffineQuantizedTensor",
                                           (("tensor_impl", ("PlainAQTTensorImpl",
                                                             (("int_data", codes), ("scale", None),
                                                              ("zero_point", None)))),))),))
    setattr(w, fingerprint.ORIGIN_ATTR, nested)
    assert fingerprint.origin(w) is nested
    h = hashlib.md5()
    for part in (b"original_weight_tensor", b"tensor_impl", b"int_data", codes.numpy().tobytes()):
        h.update(part)
    assert fingerprint.of_tensor(w) == h.hexdigest() != own


def test_a_nested_level_without_parts_is_not_covered():
    empty = ("LinearActivationQuantizedTensor",
             (("original_weight_tensor", ("AffineQuantizedTensor", (("tensor_impl", None),))),))
    t = torch.ones(2)
    setattr(t, fingerprint.ORIGIN_ATTR, empty)
    assert fingerprint.of_tensor(t) is None
    # nothing in the file can be fingerprinted then, which passes (Unsloth's rule for classes it cannot hash)
    assert fingerprint.verify({"a.weight": t}, {"algo": fingerprint.ALGO, "modules": {"a.weight": "00"}}) == []


def test_modules_that_are_not_an_object_are_a_reason():
    assert fingerprint.verify({}, {"algo": fingerprint.ALGO, "modules": ["a.weight"]}) == \
        ["fingerprint 'modules': expected an object, found list"]


def test_the_verified_folder_follows_the_environment(tmp_path):
    assert fingerprint.verified_dir({fingerprint.ENV_VERIFIED_DIR: str(tmp_path)}) == str(tmp_path)
    assert fingerprint.verified_dir({"XDG_CACHE_HOME": "/xdg"}) == "/xdg/comfyui-prequant/verified"
    assert fingerprint.verified_dir({}) == os.path.join(os.path.expanduser("~"), ".cache", "comfyui-prequant",
                                                        "verified")


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="giving a file to another user needs root")
def test_a_marker_owned_by_another_user_is_not_believed(tmp_path):
    f = tmp_path / "m.safetensors"
    f.write_bytes(b"x" * 10)
    st = os.stat(f)
    fp = {"algo": fingerprint.ALGO, "modules": {"a.weight": "00"}}
    folder = str(tmp_path / "verified")
    fingerprint.remember(str(f), st, fp, folder)
    assert fingerprint.remembered(str(f), st, fp, folder)
    (marker,) = [os.path.join(folder, n) for n in os.listdir(folder)]
    os.chown(marker, os.getuid() + 4321, -1)
    assert not fingerprint.remembered(str(f), st, fp, folder)

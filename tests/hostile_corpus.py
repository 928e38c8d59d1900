"""Crafted hostile checkpoints, one generator per attack class (``write_corpus``).

Each file is small on disk (a sparse file where the attack is a declared size) and aims at one way a stranger's
file could hurt the server that reads it: a crash in C code, memory far beyond what the file declares, a hang, an
uncaught exception, escape sequences in printed text. ``tests/formats/test_hostile_files.py`` feeds every file to every
entry point in a separate worker process and asserts the outcome, the time and the memory per file.
"""
from __future__ import annotations

import io
import json
import os
import struct
import zipfile

import torch

BASE_ID = "Tongyi-MAI/Z-Image-Turbo"
ESC = "\x1b[2J\x1b[H\x1b[32mVerdict  VALID\x1b[0m\n"


# ---- containers ------------------------------------------------------------------------------------------------

def torch_save_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def zip_entries(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def rezip(entries, compress: dict | None = None) -> bytes:
    """Stored (torch.save's way), 64-byte aligned records; ``compress``: names to deflate instead."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries:
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            header = 30 + len(name.encode("utf-8")) + 4
            pad = (-(buf.tell() + header)) % 64
            zi.extra = b"FB" + pad.to_bytes(2, "little") + b"Z" * pad
            if compress and name in compress:
                zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return buf.getvalue()


def with_pickle(pkl: bytes, *, deflate: bool = False) -> bytes:
    entries = zip_entries(torch_save_bytes({"format": "x", "metadata": {}, "state_dict": {"a": torch.zeros(2)}}))
    entries = [(n, pkl if n.endswith("/data.pkl") else d) for n, d in entries]
    return rezip(entries, compress={n for n, _ in entries if n.endswith("/data.pkl")} if deflate else None)


def safetensors_bytes(header: dict, data: bytes = b"", *, raw_header: bytes | None = None,
                      declared: int | None = None) -> bytes:
    blob = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(blob) if declared is None else declared) + blob + data


# ---- real tiny content -----------------------------------------------------------------------------------------

def tiny_tensors(scheme: str = "fp8") -> dict:
    from prequant_core import schemes
    g = torch.Generator().manual_seed(1)
    w = lambda r, c: torch.randn(r, c, generator=g).to(torch.bfloat16)  # noqa: E731
    return {
        "layers.0.attention.to_q.weight": schemes.quantize_weight(w(32, 32), scheme),
        "layers.0.feed_forward.w1.weight": schemes.quantize_weight(w(64, 32), scheme),
        "layers.0.attention_norm1.weight": torch.ones(32, dtype=torch.bfloat16),
    }


def tiny_metadata(tensors: dict, scheme: str = "fp8", **over) -> dict:
    from prequant_core import builder, families, schemes
    fam = families.get("z-image")
    md = builder.make_metadata(builder.Recipe(scheme, family=fam, base_model_id=BASE_ID, min_features=32,
                                              exclude=schemes.exclude_tokens(scheme, fam.arch.int8_exclude_extra)),
                               tensors)
    md.update(over)
    return md


def pt_container(tensors: dict, metadata: dict, tag: str = "unsloth_prequant_transformer_state_dict_v1") -> bytes:
    return torch_save_bytes({"format": tag, "metadata": metadata, "state_dict": tensors})


def st_container(tensors: dict, metadata: dict) -> bytes:
    from prequant_core.formats.containers.safetensors_container import flatten
    from safetensors.torch import save
    flat, header = flatten(tensors, format_tag="unsloth_prequant_transformer_state_dict_v1", metadata=metadata)
    return save(flat, metadata=header)


# ---- pickles ---------------------------------------------------------------------------------------------------

def deep_tuple_key(depth: int) -> bytes:
    """{((...((),)...),): 1} nested ``depth`` levels: hashing the key recurses in C."""
    return b"\x80\x02}" + b")" + b"\x85" * depth + b"K\x01s."


def deep_set_member(depth: int, frozen: bool) -> bytes:
    # protocol 4: EMPTY_SET / FROZENSET
    inner = b")" + b"\x85" * depth
    if frozen:
        return b"\x80\x04(" + inner + b"\x91."
    return b"\x80\x04\x8f(" + inner + b"\x90."


def deep_list(depth: int) -> bytes:
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


_WRAPPERS = {  # (prefix, suffix) around an inner value, in pickle opcodes
    "tuple1": (b"", b"\x85"),
    "tuple": (b"(", b"t"),
    "list": (b"(", b"l"),
    "frozenset": (b"(", b"\x91"),
    "dict-key": (b"}", b"K\x01s"),
    "set-member": (b"\x8f(", b"\x90"),
}


def mixed_nesting(seed: int, depth: int) -> bytes:
    """``depth`` random hashable wrappers (tuples, frozensets) around an empty tuple, held as a dict key, a set
    member or in a list: what hashes it recurses through every level."""
    import random
    rng = random.Random(seed)
    kinds = [rng.choice(["dict-key", "set-member", "list"])]
    # long runs of tuples: a frozenset caches its hash, so only tuples recurse all the way down
    kinds += [rng.choices(["tuple1", "tuple", "frozenset"], [99, 1, 0.001])[0] for _ in range(depth - 1)]
    prefix = b"".join(_WRAPPERS[k][0] for k in kinds)
    suffix = b"".join(_WRAPPERS[k][1] for k in reversed(kinds))
    return b"\x80\x04" + prefix + b")" + suffix + b"."


def bytearray8(n: int) -> bytes:
    return b"\x80\x05\x96" + struct.pack("<Q", n) + b"."


def one_byte_opcodes(n: int) -> bytes:
    return b"\x80\x02" + b"N" * n + b"."


def huge_int(nbytes: int) -> bytes:
    return b"\x80\x02\x8b" + struct.pack("<i", nbytes) + b"\x7f" * nbytes + b"."


def self_containing_metadata() -> bytes:
    """{"format": "...v1", "metadata": {"family": L}, "state_dict": {}} with L = [L]."""
    tag = b"unsloth_prequant_transformer_state_dict_v1"
    return (b"\x80\x02}(X\x06\x00\x00\x00formatX" + struct.pack("<I", len(tag)) + tag
            + b"X\x08\x00\x00\x00metadata}X\x06\x00\x00\x00family]q\x00h\x00a" + b"s"
            + b"X\x0a\x00\x00\x00state_dict}u.")


# ---- the corpus ------------------------------------------------------------------------------------------------

def _sparse(path: str, head: bytes, size: int) -> None:
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


def write_corpus(folder: str) -> list[tuple[str, str]]:
    """Write every hostile file into ``folder``; (file name, attack class) pairs."""
    from prequant_core import schemes
    from torchao.quantization.quantize_.workflows import Float8Tensor
    os.makedirs(folder, exist_ok=True)
    cases: list[tuple[str, str, bytes]] = []

    def add(name, cls, data):
        cases.append((name, cls, data))

    # C-stack recursion: deep keys / members (stored, and deflated as the attack shipped)
    for d in (1_000, 300_000):
        add(f"deep-tuple-key-{d}.pt", "deep nesting", with_pickle(deep_tuple_key(d)))
    add("deep-tuple-key-deflated.pt", "deep nesting", with_pickle(deep_tuple_key(400_000), deflate=True))
    add("deep-set-member.pt", "deep nesting", with_pickle(deep_set_member(300_000, frozen=False)))
    add("deep-frozenset-member.pt", "deep nesting", with_pickle(deep_set_member(300_000, frozen=True)))
    add("deep-list.pt", "deep nesting", with_pickle(deep_list(200_000)))
    for seed in range(4):  # seeded mixes: the depth rule must hold whatever container carries the nesting
        add(f"deep-mixed-{seed}.pt", "deep nesting", with_pickle(mixed_nesting(seed, 300_000 + 50_000 * seed)))
    # amplification inside the pickle
    add("bytearray8-4gib.pt", "amplification", with_pickle(bytearray8(4 * 2**30)))
    add("zip-bomb-data-pkl.pt", "amplification", with_pickle(b"\x80\x02N" + b"\x00" * (64 * 2**20) + b".",
                                                               deflate=True))
    add("one-byte-opcodes-40mb.pt", "amplification", with_pickle(one_byte_opcodes(40 * 2**20)))
    add("one-byte-opcodes-2m.pt", "amplification", with_pickle(one_byte_opcodes(2_000_100)))
    add("huge-int.pt", "amplification", with_pickle(huge_int(2**20)))
    # declared sizes that store nothing
    stride0 = torch.zeros(1, dtype=torch.bfloat16).expand(2**28)
    add("stride0-plain.pt", "declared size", pt_container({"layers.0.attention_norm1.weight": stride0},
                                                           {"scheme": "fp8"}))
    t = tiny_tensors()
    md = tiny_metadata(t)
    wide = Float8Tensor(torch.zeros(1, 1, dtype=torch.float8_e4m3fn).expand(2**26, 64),
                        torch.ones(1, 1).expand(2**26, 1), [1, 64], dtype=torch.bfloat16)
    add("stride0-quantized.pt", "declared size", pt_container({**t, "layers.0.feed_forward.w2.weight": wide}, md))
    zero_width = Float8Tensor(torch.empty(2**30, 0, dtype=torch.float8_e4m3fn), torch.ones(1, 1), [1, 0],
                              dtype=torch.bfloat16)
    add("zero-width-quantized.pt", "declared size",
        pt_container({**t, "layers.0.feed_forward.w2.weight": zero_width}, md))
    add("zero-numel-overflow.safetensors", "declared size", safetensors_bytes(
        {"x": {"dtype": "BF16", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}}))
    native_zero_width = safetensors_bytes({
        "l.weight": {"dtype": "F8_E4M3", "shape": [2**31, 0], "data_offsets": [0, 0]},
        "l.weight_scale": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
        "l.comfy_quant": {"dtype": "U8", "shape": [len(b'{"format": "float8_e4m3fn"}')],
                          "data_offsets": [4, 4 + len(b'{"format": "float8_e4m3fn"}')]}},
        struct.pack("<f", 1.0) + b'{"format": "float8_e4m3fn"}')
    add("comfy-native-zero-width.safetensors", "declared size", native_zero_width)
    # header size / JSON structure
    with_hdr = os.path.join(folder, "header-100mb.safetensors")
    _sparse(with_hdr, struct.pack("<Q", 100 * 2**20) + b"{", 100 * 2**20 + 64)
    add("deep-json-header.safetensors", "malformed JSON",
        safetensors_bytes({}, raw_header=b"[" * 100_000 + b"]" * 100_000))
    deep_md = "[" * 5000 + "]" * 5000
    add("deep-json-metadata.safetensors", "malformed JSON",
        safetensors_bytes({"__metadata__": {"unsloth_format": "unsloth_prequant_transformer_state_dict_v1",
                                            "unsloth_metadata": deep_md}}))
    add("nan-metadata.safetensors", "malformed JSON",
        safetensors_bytes({"__metadata__": {"unsloth_format": "unsloth_prequant_transformer_state_dict_v1",
                                            "unsloth_metadata": '{"min_features": NaN}'}}))
    add("self-containing-metadata.pt", "malformed metadata", with_pickle(self_containing_metadata()))
    add("tensor-as-metadata.pt", "malformed metadata", pt_container(t, torch.zeros(3)))
    add("tensor-in-metadata.pt", "malformed metadata", pt_container(t, {**md, "family": torch.zeros(2**10)}))
    # values that must not reach a terminal raw
    esc_md = tiny_metadata(t, family="z-image" + ESC, base_model_id=BASE_ID + ESC)
    add("ansi-metadata.safetensors", "escapes", st_container(t, esc_md))
    add("ansi-metadata.pt", "escapes", pt_container(t, esc_md))
    add("ansi-tensor-name.pt", "escapes", pt_container({**t, "layers.0." + ESC + ".weight": torch.ones(2)}, md))
    # non-finite scales in the Unsloth containers
    nan_t = dict(t)
    q = nan_t["layers.0.attention.to_q.weight"]
    bad_scale = q.scale.clone()
    bad_scale[3] = float("nan")
    nan_t["layers.0.attention.to_q.weight"] = Float8Tensor(q.qdata, bad_scale, q.block_size, mm_config=q.mm_config,
                                                           act_quant_kwargs=q.act_quant_kwargs,
                                                           kernel_preference=q.kernel_preference, dtype=q.dtype)
    add("nan-scale.pt", "non-finite scale", pt_container(nan_t, md))
    add("nan-scale.safetensors", "non-finite scale", st_container(nan_t, md))
    # per-block (NVFP4) weights that declare more than they store, or scales that cannot be right
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor
    nv = schemes.quantize_weight(torch.randn(64, 64).to(torch.bfloat16), "nvfp4")
    nv_wide = NVFP4Tensor(torch.zeros(1, 1, dtype=torch.uint8).expand(2**26, 32), nv.scale, 16, torch.bfloat16,
                          nv.per_tensor_scale, is_swizzled_scales=True)
    add("nvfp4-stride0.pt", "declared size", pt_container({**t, "layers.0.feed_forward.w2.weight": nv_wide},
                                                          tiny_metadata(t, "nvfp4")))
    nv_nan = NVFP4Tensor(nv.qdata, nv.scale, 16, torch.bfloat16, torch.tensor(float("nan")),
                         is_swizzled_scales=True)
    add("nvfp4-nan-tensor-scale.pt", "non-finite scale", pt_container({**t, "layers.0.feed_forward.w2.weight": nv_nan},
                                                                      tiny_metadata(t, "nvfp4")))
    nv_big_pts = NVFP4Tensor(nv.qdata, nv.scale, 16, torch.bfloat16, torch.zeros(1, 1, 1).expand(2**24, 1, 1),
                             is_swizzled_scales=True)
    add("nvfp4-per-expert-scale.pt", "declared size",
        pt_container({**t, "layers.0.feed_forward.w2.weight": nv_big_pts}, tiny_metadata(t, "nvfp4")))
    policy_md = tiny_metadata(t, "nvfp4", nvfp4_policy={"kind": "unsloth_nvfp4_layer_policy_v1", "policy_id": "x",
                                                         "policy_version": 1, "counts": {"nvfp4": 10**12},
                                                         "nvfp4_fqns": ["a"] * 100_000})
    add("nvfp4-policy-lies.pt", "lying declaration",
        pt_container(t, policy_md, tag="unsloth_prequant_transformer_state_dict_v3"))
    # round 3: what a tensor subclass carries besides its bytes (torch restores a pickled __dict__ as it is)
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.quantization.quantize_.workflows import Int8Tensor
    i8 = tiny_tensors("int8")
    i8_md = tiny_metadata(i8, "int8")

    def with_attr(tensors, key, name, value):
        out = dict(tensors)
        w = schemes.quantize_weight(torch.randn(*out[key].shape).to(torch.bfloat16),
                                    "int8" if isinstance(out[key], Int8Tensor) else "fp8")
        w.__dict__[name] = value
        out[key] = w
        return out
    q_key = "layers.0.attention.to_q.weight"
    add("attr-undeclared-rotation-4p8.pt", "tensor attributes",
        pt_container(with_attr(i8, q_key, "prequant_rotation", 4 ** 8), i8_md))
    add("attr-undeclared-rotation-4p31.pt", "tensor attributes",
        pt_container(with_attr(i8, q_key, "prequant_rotation", 4 ** 31), i8_md))
    add("attr-string-act-kwargs.pt", "tensor attributes",
        pt_container(with_attr(t, q_key, "act_quant_kwargs", "not kwargs"), md))
    add("attr-string-kernel.pt", "tensor attributes", pt_container(with_attr(t, q_key, "kernel_preference", "x"), md))
    add("attr-static-act-scale.pt", "tensor attributes",
        pt_container(with_attr(i8, q_key, "act_pre_scale", torch.ones(32)), i8_md))
    add("attr-block-size-list.pt", "tensor attributes", pt_container(with_attr(t, q_key, "block_size", [1, 2**40]), md))
    nv2 = schemes.quantize_weight(torch.randn(64, 64).to(torch.bfloat16), "nvfp4")
    nv2.__dict__["block_size"] = "16"
    add("attr-nvfp4-block-size-string.pt", "tensor attributes",
        pt_container({**t, "layers.0.feed_forward.w2.weight": nv2}, tiny_metadata(t, "nvfp4")))
    # values that would make outputs NaN / infinite or silently wrong
    nan_plain = dict(t)
    nan_plain["layers.0.attention_norm1.weight"] = torch.ones(32, dtype=torch.bfloat16)
    nan_plain["layers.0.attention_norm1.weight"][5] = float("nan")
    add("nan-plain-weight.pt", "non-finite value", pt_container(nan_plain, md))
    add("nan-plain-weight.safetensors", "non-finite value", st_container(nan_plain, md))
    for name, dtype_t in (("int", torch.arange(32, dtype=torch.int64)), ("bool", torch.ones(32, dtype=torch.bool)),
                          ("complex", torch.ones(32, dtype=torch.complex64)),
                          ("qint8", torch.quantize_per_tensor(torch.ones(32), 0.1, 0, torch.qint8))):
        add(f"plain-{name}-tensor.pt", "wrong dtype", pt_container({**t, "layers.0.attention_norm1.weight": dtype_t}, md))
    mx = schemes.quantize_weight(torch.randn(128, 64).to(torch.bfloat16), "mxfp8")
    mx_md = tiny_metadata(t, "mxfp8")
    mx_big = MXTensor(mx.qdata, torch.full_like(mx.scale.view(torch.uint8), 254).view(torch.float8_e8m0fnu),
                      mx.elem_dtype, 32, mx.orig_dtype, mx.kernel_preference, mx.act_quant_kwargs, True)
    add("mxfp8-exponent-254.pt", "non-finite value", pt_container({**t, "layers.0.feed_forward.w2.weight": mx_big}, mx_md))
    mx_flip = MXTensor(mx.qdata, mx.scale, mx.elem_dtype, 32, mx.orig_dtype, mx.kernel_preference, mx.act_quant_kwargs,
                       False)
    add("mxfp8-flipped-swizzle.pt", "non-finite value",
        pt_container({**t, "layers.0.feed_forward.w2.weight": mx_flip}, mx_md))
    for name, pts in (("huge", 1e38), ("zero", 0.0), ("negative", -1.0)):
        bad = NVFP4Tensor(nv.qdata, nv.scale, 16, torch.bfloat16, torch.tensor(pts, dtype=torch.float32),
                          is_swizzled_scales=True, act_quant_kwargs=nv.act_quant_kwargs)
        add(f"nvfp4-{name}-tensor-scale.pt", "non-finite value",
            pt_container({**t, "layers.0.feed_forward.w2.weight": bad}, tiny_metadata(t, "nvfp4")))
    # text from a file holding a lone surrogate: must reach no log, terminal or JSON raw
    add("surrogate-metadata.pt", "escapes", pt_container(t, tiny_metadata(t, family="z-image\ud800",
                                                                      base_model_id="a/b\udcff")))
    add("surrogate-tensor-name.pt", "escapes", pt_container({**t, "layers.0.\ud800.weight": torch.ones(2)}, md))
    # unsupported opcode vs a global: different words
    add("text-int-opcode.pt", "wording", with_pickle(b"\x80\x02(I1\nI2\nt."))
    add("global-os-system.pt", "wording", with_pickle(b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R."))
    # a control: the same content, well formed, must load
    add("control-ok.pt", "control", pt_container(t, md))
    add("control-ok.safetensors", "control", st_container(t, md))
    del schemes
    out = [("header-100mb.safetensors", "amplification")]
    for name, cls, data in cases:
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
        out.append((name, cls))
    return out

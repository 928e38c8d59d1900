"""Legacy torchao-v1 ``.pt`` weights (``prequant_core/formats/containers/legacy_v1.py``) beyond the int8 file
tests/formats/test_legacy_formats.py reads: a weight-only ``AffineQuantizedTensor`` (read), parameters and tensors carrying
Python attributes beside the weights (read), and each v1 record this
pack does not read refused by what it is (``decode_aqt`` / ``decode_weight`` / ``_read``): activations quantized
asymmetrically, a non-zero zero point, per-group scales, another quantization range or zero-point domain, another
implementation inside, a nested or empty activation wrapper, extra quantizer arguments, a float64 logical dtype, a
container whose format tag or metadata has the wrong type.

Every file is written by the real torchao 0.14.1 (the last release with the v1 classes; installed at
.cache/torchao014 by scripts/setup_dev.sh) with ``torch.save``, in one subprocess; attributes are set on torchao's
own objects where torchao would not produce the variant itself. Nothing here imports ComfyUI.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pickle_asm as asm
import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT
from prequant_core import formats
from prequant_core.errors import CorruptCheckpointError, UnsupportedFormatError
from prequant_core.formats.checkpoint import FORMAT_V1
from prequant_core.formats.containers import legacy_v1
from prequant_core.schemes import qtensor

TORCHAO014 = os.path.join(ROOT, ".cache", "torchao014")

WRITER = textwrap.dedent("""
    import os, sys, warnings
    import torch
    from safetensors.torch import save_file
    warnings.simplefilter("ignore")
    import torchao
    assert torchao.__version__.startswith("0.14"), torchao.__version__
    from torchao.dtypes import to_affine_quantized_intx
    from torchao.dtypes.affine_quantized_tensor import AffineQuantizedTensor
    from torchao.quantization import int8_weight_only, quantize_
    from torchao.quantization.linear_activation_quantized_tensor import LinearActivationQuantizedTensor as LAQT
    from torchao.quantization.quant_api import _int8_asymm_per_token_quant as ASYM
    from torchao.quantization.quant_api import _int8_symm_per_token_reduced_range_quant as SYM
    from torchao.quantization.quant_primitives import MappingType, ZeroPointDomain

    out, fmt = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    w = torch.randn(8, 64, dtype=torch.bfloat16)

    def aqt(mapping=MappingType.SYMMETRIC, block=(1, 64), **kw):
        return to_affine_quantized_intx(w, mapping, block, torch.int8, eps=1e-5, zero_point_dtype=torch.int64, **kw)

    def save(name, sd, meta=None, tag=fmt, **kw):
        torch.save({"format": tag, "metadata": {"scheme": "int8"} if meta is None else meta, "state_dict": sd},
                   os.path.join(out, name + ".pt"), **kw)

    # readable
    lin = torch.nn.Linear(64, 8, bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(w)
    quantize_(lin, int8_weight_only())
    wo = lin.state_dict()["weight"]
    assert type(wo) is AffineQuantizedTensor, type(wo)
    save("weight-only", {"blocks.0.proj.weight": wo})
    save_file({"int_data": wo.tensor_impl.int_data.contiguous(), "scale": wo.tensor_impl.scale.contiguous()},
              os.path.join(out, "weight-only-codes.safetensors"))
    param = torch.nn.Parameter(torch.arange(4.0), requires_grad=False)
    noted_param = torch.nn.Parameter(torch.arange(3.0), requires_grad=False)
    noted_param.note = "an attribute a training script left"
    noted = torch.arange(5.0)
    noted.note = "another"
    save("attributes", {"blocks.0.proj.weight": LAQT(aqt(), SYM, None), "norm.weight": param,
                        "norm2.weight": noted_param, "blocks.0.proj.bias": noted})

    # refused
    save("asymmetric-activations", {"blocks.0.proj.weight": LAQT(aqt(), ASYM, None)})
    save("quant-kwargs", {"blocks.0.proj.weight": LAQT(aqt(), SYM, {"eps": 1e-6})})
    save("nested-wrapper", {"blocks.0.proj.weight": LAQT(LAQT(aqt(), SYM, None), SYM, None)})
    save("plain-inside-wrapper", {"blocks.0.proj.weight": LAQT(w.clone(), SYM, None)})
    save("no-activation-function", {"blocks.0.proj.weight": LAQT(aqt(), None, None)})
    save("asymmetric-weight", {"blocks.0.proj.weight": aqt(MappingType.ASYMMETRIC)})
    save("per-group", {"blocks.0.proj.weight": aqt(block=(1, 32))})
    save("range", {"blocks.0.proj.weight": aqt(quant_min=-100, quant_max=100)})
    save("float-domain", {"blocks.0.proj.weight": aqt(MappingType.ASYMMETRIC, zero_point_domain=ZeroPointDomain.FLOAT)})
    other_impl = aqt()
    other_impl.tensor_impl = w.clone()
    save("tensor-as-impl", {"blocks.0.proj.weight": other_impl})
    bad_zp = aqt()
    bad_zp.tensor_impl.zero_point = torch.zeros(3, dtype=torch.int64)
    save("zero-point-shape", {"blocks.0.proj.weight": bad_zp})
    a = aqt()
    save("float64", {"blocks.0.proj.weight": AffineQuantizedTensor(a.tensor_impl, a.block_size, a.shape, a.quant_min,
                                                                    a.quant_max, a.zero_point_domain,
                                                                    dtype=torch.float64)})
    save("tag-not-a-string", {"blocks.0.proj.weight": LAQT(aqt(), SYM, None)}, tag=1)
    save("metadata-not-a-dict", {"blocks.0.proj.weight": LAQT(aqt(), SYM, None)}, meta=["scheme", "int8"])
""")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    if not os.path.isfile(os.path.join(TORCHAO014, "torchao", "__init__.py")):
        pytest.fail("torchao 0.14.1 is missing at .cache/torchao014: run scripts/setup_dev.sh")
    out = tmp_path_factory.mktemp("legacy_v1_records")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TORCHAO014, ROOT]))
    r = subprocess.run([sys.executable, "-c", WRITER, str(out), FORMAT_V1], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-3000:]
    return out


def test_a_weight_only_affine_quantized_tensor_reads_as_int8_weight_only(files):
    ck = formats.read(str(files / "weight-only.pt"))
    assert ck.container == "legacy-pt" and ck.format_tag == FORMAT_V1
    t = ck.tensors["blocks.0.proj.weight"]
    assert qtensor.scheme_of(t) == "int8-weight-only" and t.act_quant_kwargs is None
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (8, 64)
    want = load_file(str(files / "weight-only-codes.safetensors"))
    assert torch.equal(t.qdata, want["int_data"])
    assert t.scale.dtype == torch.float32 and torch.equal(t.scale.reshape(-1), want["scale"].float().reshape(-1))


def test_parameters_and_tensor_attributes_beside_the_weights_read_as_plain_tensors(files):
    ck = formats.read(str(files / "attributes.pt"))
    assert qtensor.is_quantized(ck.tensors["blocks.0.proj.weight"])
    for k, want in (("norm.weight", torch.arange(4.0)), ("norm2.weight", torch.arange(3.0)),
                    ("blocks.0.proj.bias", torch.arange(5.0))):
        got = ck.tensors[k]
        assert type(got) is torch.Tensor and torch.equal(got, want), k
        assert not hasattr(got, "note"), "a file's Python attributes are not kept"


@pytest.mark.parametrize("name,message", [
    ("asymmetric-activations", "quantizes activations asymmetrically (_int8_asymm_per_token_quant)"),
    ("asymmetric-weight", "is asymmetric (non-zero zero point); only symmetric int8 is supported"),
    ("per-group", "is not quantized per row (scale (8, 2) for 8 rows)"),
    ("range", "uses the quantization range -100..100"),
    ("float-domain", "uses ZeroPointDomain.FLOAT, which this pack does not read"),
    ("tensor-as-impl", "uses the torchao layout 'Tensor', not the plain int8 layout this pack reads"),
])
def test_v1_weights_of_another_kind_are_unsupported_naming_it(files, name, message):
    path = str(files / f"{name}.pt")
    with pytest.raises(UnsupportedFormatError) as e:
        formats.read(path)
    assert "Legacy weight 'blocks.0.proj.weight'" in e.value.message and message in e.value.message, e.value.message
    assert e.value.path == os.path.realpath(path) and e.value.fix


@pytest.mark.parametrize("name,found", [
    ("quant-kwargs", "unexpected activation quantizer arguments"),
    ("nested-wrapper", "expected an AffineQuantizedTensor inside, found LinearActivationQuantizedTensor"),
    ("plain-inside-wrapper", "no weight inside the activation wrapper"),
    ("no-activation-function", "activation quantizer is not a known torchao function"),
    ("zero-point-shape", "zero point shape"),
    ("float64", "logical dtype torch.float64"),
])
def test_malformed_v1_records_are_corrupt_naming_the_weight(files, name, found):
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(str(files / f"{name}.pt"))
    assert "A legacy quantized weight is malformed" in e.value.message
    assert "'blocks.0.proj.weight'" in e.value.found and found in e.value.found, e.value.found


@pytest.mark.parametrize("name,message", [
    ("tag-not-a-string", "The container's 'format' entry is not a string."),
    ("metadata-not-a-dict", "The container's 'metadata' / 'state_dict' entries are not dicts."),
])
def test_a_container_with_mistyped_entries_is_corrupt(files, name, message):
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(str(files / f"{name}.pt"))
    assert e.value.message == message


# ---- crafted pickles: what torch.save never writes from these objects, but a stranger's file may hold -------------
# a tiny protocol-2 assembler (as in tests/formats/test_legacy_formats.py), so every byte of each payload is visible here

_g, _s, _int = asm.global_, asm.string, asm.int32
MARK, TUPLE, EMPTY_TUPLE, REDUCE, POP, EMPTY_DICT, SETITEMS, STOP, NEWOBJ, BUILD, NEWFALSE = \
    asm.MARK, asm.TUPLE, asm.EMPTY_TUPLE, asm.REDUCE, asm.POP, asm.EMPTY_DICT, asm.SETITEMS, asm.STOP, asm.NEWOBJ, asm.BUILD, asm.NEWFALSE
EMPTY_SET, ADDITEMS = b"\x8f", b"\x90"
LAQT = _g("torchao.quantization.linear_activation_quantized_tensor", "LinearActivationQuantizedTensor")
AQT = _g("torchao.dtypes.affine_quantized_tensor", "AffineQuantizedTensor")
ORDERED_DICT = _g("collections", "OrderedDict")


def _storage(kind="FloatStorage", numel=2):
    return MARK + _s("storage") + _g("torch", kind) + _s("0") + _s("cpu") + _int(numel) + TUPLE + b"Q"


def _tensor(n=2, *, storage=None, metadata=b""):
    """``torch._utils._rebuild_tensor_v2`` of the archive's one storage (two float32 values)."""
    return (_g("torch._utils", "_rebuild_tensor_v2") + MARK + (storage or _storage()) + _int(0) + MARK + _int(n)
            + TUPLE + MARK + _int(1) + TUPLE + NEWFALSE + ORDERED_DICT + EMPTY_TUPLE + REDUCE + metadata
            + TUPLE + REDUCE)


def _container(weight: bytes, *, before: bytes = b"", metadata: bytes = EMPTY_DICT) -> bytes:
    """The v1 container: LAQT named first (what sends the file to the legacy reader), then ``before`` evaluated and
    dropped, then {"format", "state_dict": {"w.weight": weight}, "metadata"}."""
    return (b"\x80\x02" + LAQT + POP + before + EMPTY_DICT + MARK + _s("format") + _s(FORMAT_V1) + _s("state_dict")
            + EMPTY_DICT + MARK + _s("w.weight") + weight + SETITEMS + _s("metadata") + metadata + SETITEMS + STOP)


def test_control_a_crafted_container_with_a_plain_tensor_reads(tmp_path):
    ck = formats.read(asm.write_pt(tmp_path / "ok.pt", _container(_tensor())))
    assert ck.container == "legacy-pt" and torch.equal(ck.tensors["w.weight"], torch.ones(2))


def test_a_big_endian_archive_is_byteswapped_on_read(tmp_path):
    if sys.byteorder != "little":
        pytest.skip("the swap is tested from a little-endian machine")
    path = asm.write_pt(tmp_path / "big.pt", _container(_tensor()), big_endian=True)
    for mmap in (True, False):
        got = legacy_v1.read_legacy_v1(path, mmap=mmap).tensors["w.weight"]
        assert torch.equal(got, torch.ones(2)), (mmap, got)


def test_empty_states_torch_never_writes_read_and_a_set_is_no_metadata(tmp_path):
    layout = _g("torchao.dtypes.utils", "PlainLayout") + EMPTY_TUPLE + NEWOBJ + EMPTY_DICT + BUILD + POP
    ordered = ORDERED_DICT + EMPTY_TUPLE + REDUCE + EMPTY_DICT + BUILD + POP
    a_set = EMPTY_SET + MARK + _s("norm") + _s("embed") + ADDITEMS
    ck = formats.read(asm.write_pt(tmp_path / "states.pt", _container(_tensor(), before=layout + ordered + a_set + POP)))
    assert torch.equal(ck.tensors["w.weight"], torch.ones(2))
    # the same set kept in the metadata: not the JSON-like data Unsloth's metadata holds
    meta = EMPTY_DICT + _s("exclude_name_tokens") + a_set + b"s"
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(asm.write_pt(tmp_path / "set-meta.pt", _container(_tensor(), metadata=meta)))
    assert "metadata is malformed" in e.value.message and "set" in e.value.found


@pytest.mark.parametrize("case,found", [
    ("a PlainLayout state that is not a dict", "PlainLayout state is not a dict"),
    ("tensor metadata", "a tensor carries extra tensor metadata"),
    ("one storage under two dtypes", "storage 0 is referenced with two dtypes"),
    ("a str built from two arguments", "unexpected arguments for str"),
    ("a parameter rebuilt as a subclass", "unexpected tensor rebuild"),
    ("a subclass rebuilt as another", "LinearActivationQuantizedTensor rebuilt with a mismatched type or state"),
    ("a plain tensor rebuilt as a v1 class", "a plain tensor rebuilt as an unexpected type"),
])
def test_crafted_records_are_corrupt_naming_what_is_wrong(tmp_path, case, found):
    subclass = (MARK + LAQT + _g("torch", "bfloat16") + MARK
                + _int(2) + TUPLE + MARK + _int(1) + TUPLE + _int(0) + _g("torch.serialization", "_get_layout")
                + _s("torch.strided") + b"\x85" + REDUCE + _g("torch", "device") + _s("cpu") + b"\x85" + REDUCE
                + NEWFALSE + TUPLE)
    from_type = _g("torch._tensor", "_rebuild_from_type_v2")
    weight = {
        "a PlainLayout state that is not a dict":
            _g("torchao.dtypes.utils", "PlainLayout") + EMPTY_TUPLE + NEWOBJ + MARK + _int(1) + b"l" + BUILD + POP
            + _tensor(),
        "tensor metadata": _tensor(metadata=EMPTY_DICT + _s("conj") + NEWFALSE + b"s"),
        "one storage under two dtypes": _tensor() + POP + _tensor(storage=_storage("ByteStorage", 8)),
        "a str built from two arguments":
            _g("torch.torch_version", "TorchVersion") + MARK + _s("2") + _s("3") + TUPLE + NEWOBJ + POP + _tensor(),
        "a parameter rebuilt as a subclass":
            from_type + MARK + _g("torch._utils", "_rebuild_parameter") + _g("torch", "Tensor") + EMPTY_TUPLE
            + EMPTY_DICT + TUPLE + REDUCE,
        "a subclass rebuilt as another":
            from_type + MARK + _g("torch._utils", "_rebuild_wrapper_subclass") + AQT + subclass + EMPTY_DICT + TUPLE
            + REDUCE,
        "a plain tensor rebuilt as a v1 class":
            from_type + MARK + _g("torch._utils", "_rebuild_tensor_v2") + LAQT + _tensor()[len(
                _g("torch._utils", "_rebuild_tensor_v2")):-len(REDUCE)] + EMPTY_DICT + TUPLE + REDUCE,
    }[case]
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(asm.write_pt(tmp_path / "bad.pt", _container(weight)))
    assert "legacy" in e.value.message and found in e.value.found, (e.value.message, e.value.found)


def test_a_pt_file_in_a_newer_pickle_protocol_is_refused_for_what_it_is(tmp_path):
    """torch.save(..., pickle_protocol=4) writes FRAME opcodes, which torch's own safe loader refuses as well: the
    refusal names the opcode and the protocol, and no longer claims torch.save never writes it."""
    from prequant_core.errors import CorruptCheckpointError
    from prequant_core.load.opening import open_checkpoint
    path = str(tmp_path / "protocol4.pt")
    torch.save({"a.weight": torch.ones(4, 4)}, path, pickle_protocol=4)
    with pytest.raises(CorruptCheckpointError) as e:
        open_checkpoint(path, model_dirs=[str(tmp_path)])
    msg = str(e.value)
    assert "opcode FRAME" in msg and "default pickle protocol" in msg and "never writes" not in msg, msg

"""The readers' refusals no other file reaches (``prequant_core/formats``), each through ``formats.read`` on a real
file: a quantized tensor's header entry that is not JSON (``torchao_json.decode_weight``), an
``unsloth_root_tensors`` header entry that is not a list of names (``safetensors_container.assemble``), a folder given
where a checkpoint file belongs (``file_handle.open_file``), and a legacy torchao-v1 ``.pt`` whose pickle hands a v1
class where a tensor layout belongs: refused as damaged, the class named by its inert stand-in
(``legacy_v1._V1Class``). The bad safetensors files are the pack's own int8 file
written again with one header entry changed. Core tier: no ComfyUI."""
from __future__ import annotations

import json

import pickle_asm as asm
import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from prequant_core import formats
from prequant_core.errors import CorruptCheckpointError
from prequant_core.formats.checkpoint import FORMAT_V1


def _rewritten(src: str, dest: str, **changes) -> str:
    """``src`` (a real pack-built .safetensors) written again with its tensors and its header entries, some changed."""
    with safe_open(src, "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())
    meta.update(changes)
    save_file(tensors, dest, metadata=meta)
    return dest


@pytest.fixture(scope="module")
def int8_file(prequant_files):
    return prequant_files("int8", "safetensors")


def test_the_untouched_file_reads(int8_file):
    """Control for the two refusals below: the file they are written from reads."""
    ck = formats.read(int8_file)
    assert ck.container == "safetensors" and "layers.0.attention.to_q.weight" in ck.tensors


def test_a_quantized_tensors_header_entry_that_is_not_json_is_refused_naming_it(int8_file, tmp_path):
    name = "layers.0.attention.to_q.weight"
    with safe_open(int8_file, "pt") as f:
        assert name in json.loads(f.metadata()["tensor_names"]) and json.loads(f.metadata()[name])
    path = _rewritten(int8_file, str(tmp_path / "entry.safetensors"), **{name: "{'_type': not json"})
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    msg = str(e.value)
    assert f"Quantized tensor '{name}' cannot be decoded: tensor entry is not JSON (" in msg, msg
    assert "entry.safetensors" in msg


@pytest.mark.parametrize("roots", ['{"not": "a list"}', '["ok", 3]', '"one name"'], ids=["object", "mixed", "string"])
def test_a_root_tensor_list_that_is_not_a_list_of_names_is_refused_naming_the_file(int8_file, tmp_path, roots):
    path = _rewritten(int8_file, str(tmp_path / "roots.safetensors"), unsloth_root_tensors=roots)
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    msg = str(e.value)
    assert "Header entry 'unsloth_root_tensors' is not a list of names." in msg and "roots.safetensors" in msg


def test_a_tensor_the_header_lists_but_the_file_lacks_is_refused_naming_it(int8_file, tmp_path):
    with safe_open(int8_file, "pt") as f:
        names = json.loads(f.metadata()["tensor_names"])
    path = _rewritten(int8_file, str(tmp_path / "ghost.safetensors"), tensor_names=json.dumps([*names, "ghost.weight"]),
                      **{"ghost.weight": "{}"})
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    msg = str(e.value)
    assert "Tensor 'ghost.weight' is listed in the header but missing." in msg and "ghost.safetensors" in msg, msg


def test_a_file_with_no_tensor_is_refused_as_holding_none(int8_file, tmp_path):
    with safe_open(int8_file, "pt") as f:
        meta = dict(f.metadata())
    path = str(tmp_path / "empty.safetensors")
    save_file({}, path, metadata={**meta, "tensor_names": "[]"})  # the pack's header, no tensor at all
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    assert "The checkpoint holds no tensors." in str(e.value) and "empty.safetensors" in str(e.value), str(e.value)


def test_a_folder_given_as_the_checkpoint_is_refused_as_a_folder(tmp_path):
    folder = tmp_path / "Z-Image-Turbo-INT8.safetensors"  # a folder with a checkpoint's name
    folder.mkdir()
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(str(folder))
    msg = str(e.value)
    assert "Expected a checkpoint file but this is a folder." in msg and str(folder) in msg
    assert "Point at the .safetensors or .pt file inside it." in msg
    with pytest.raises(CorruptCheckpointError, match="this is a folder"):
        formats.open_file(str(folder))


# --- a crafted legacy torchao-v1 pickle (tests/pickle_asm.py: every byte shown) ---------------------------------------

_g, _s = asm.global_, asm.string
LAQT = _g("torchao.quantization.linear_activation_quantized_tensor", "LinearActivationQuantizedTensor")
AQT = _g("torchao.dtypes.affine_quantized_tensor", "AffineQuantizedTensor")


def _container(weight: bytes) -> bytes:
    return (b"\x80\x02" + asm.EMPTY_DICT + asm.MARK + _s("format") + _s(FORMAT_V1) + _s("metadata") + asm.EMPTY_DICT
            + _s("state_dict") + asm.EMPTY_DICT + asm.MARK + _s("w.weight") + weight + asm.SETITEMS + asm.SETITEMS
            + asm.STOP)


def test_a_v1_class_where_a_tensor_layout_belongs_is_refused_naming_the_class(tmp_path):
    layout_of_a_class = _g("torch.serialization", "_get_layout") + asm.MARK + AQT + asm.TUPLE + asm.REDUCE
    path = asm.write_pt(tmp_path / "odd-int8.pt", _container(LAQT + asm.POP + layout_of_a_class))
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(path)
    msg = str(e.value)
    assert "The legacy .pt file is damaged" in msg and "odd-int8.pt" in msg, msg
    assert "tensor layout <torchao v1 AffineQuantizedTensor>" in msg, msg
    # control: the layout torch.save names is decoded (the file then fails only where its weight is not a tensor)
    fine = _g("torch.serialization", "_get_layout") + asm.MARK + _s("torch.strided") + asm.TUPLE + asm.REDUCE
    with pytest.raises(CorruptCheckpointError) as e:
        formats.read(asm.write_pt(tmp_path / "layout-int8.pt", _container(LAQT + asm.POP + fine)))
    assert "Entry 'w.weight' is not a tensor." in str(e.value) and "Found: layout" in str(e.value), str(e.value)

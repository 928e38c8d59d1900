"""Bad input: every case is a typed error that names the file and the fix; nothing runs, nothing is written."""
from __future__ import annotations

import os
import pickle
import zipfile

import pytest
import torch

from conftest import BASE_ID
from prequant_core import errors, formats
from prequant_core.load.opening import open_checkpoint
from prequant_core.load.metadata import Request


@pytest.fixture
def folder(tmp_path, allow_dir):
    d = tmp_path / "allowed"
    d.mkdir()
    allow_dir(d)
    return d


def _open(path, **req):
    return open_checkpoint(str(path), Request(**req))


def _rewrite_pt(src, dst, mutate):
    obj = torch.load(src, weights_only=True, mmap=False)
    mutate(obj)
    torch.save(obj, dst)
    return dst


def assert_actionable(err: errors.PrequantError, path_part: str):
    text = str(err)
    assert path_part in text, text
    assert err.fix or err.reasons, text


def test_path_outside_allowlist(prequant_files, tmp_path, monkeypatch):
    monkeypatch.delenv("PREQUANT_ALLOW_LOCAL_PATH", raising=False)
    monkeypatch.delenv("UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH", raising=False)
    with pytest.raises(errors.PathNotAllowedError) as e:
        _open(prequant_files("int8"))
    assert "PREQUANT_ALLOW_LOCAL_PATH" in str(e.value)


def test_bare_flag_values_are_not_directories(prequant_files, monkeypatch):
    monkeypatch.chdir(os.path.dirname(prequant_files("int8")))
    monkeypatch.setenv("PREQUANT_ALLOW_LOCAL_PATH", "1")
    monkeypatch.setenv("UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH", "true")
    with pytest.raises(errors.PathNotAllowedError):
        _open(os.path.basename(prequant_files("int8")))


def test_unsloth_variable_is_honoured(prequant_files, monkeypatch):
    monkeypatch.delenv("PREQUANT_ALLOW_LOCAL_PATH", raising=False)
    monkeypatch.setenv("UNSLOTH_ALLOW_LOCAL_PREQUANT_PATH", os.path.dirname(prequant_files("int8")))
    assert _open(prequant_files("int8")).family.name == "z-image"


def test_symlink_escaping_the_allowlist(prequant_files, folder):
    link = folder / "escape.safetensors"
    os.symlink(prequant_files("int8"), link)  # target lies outside the allowed folder
    with pytest.raises(errors.PathNotAllowedError) as e:
        _open(link)
    assert "resolves to" in str(e.value)


def test_missing_file(folder):
    with pytest.raises(errors.CheckpointNotFoundError) as e:
        _open(folder / "nope.safetensors")
    assert_actionable(e.value, "nope.safetensors")


@pytest.mark.parametrize("container", ["safetensors", "pt"])
def test_truncated(prequant_files, folder, container):
    src = prequant_files("int8", container)
    dst = folder / f"cut.{container}"
    data = open(src, "rb").read()
    dst.write_bytes(data[: len(data) // 2])
    with pytest.raises(errors.CorruptCheckpointError) as e:
        _open(dst)
    assert_actionable(e.value, "cut.")


def test_not_a_checkpoint(folder):
    p = folder / "page.safetensors"
    p.write_text("<html>404 Not Found</html>")
    with pytest.raises(errors.CorruptCheckpointError) as e:
        _open(p)
    assert_actionable(e.value, "page.safetensors")


def test_dense_pt_is_not_a_container(folder):
    p = folder / "dense.pt"
    torch.save({"w": torch.zeros(2, 2)}, p)
    with pytest.raises(errors.CorruptCheckpointError) as e:
        _open(p)
    assert "'format', 'metadata' and 'state_dict'" in str(e.value)


@pytest.mark.parametrize("tag,needle", [
    ("unsloth_prequant_transformer_state_dict_v2", "activation_rotation"),  # v2 / v3 tags need their fields
    ("unsloth_prequant_transformer_state_dict_v3", "nvfp4_policy"),
    ("something_else_v9", "unknown format tag"),
])
def test_format_tags_refused(prequant_files, folder, tag, needle):
    dst = _rewrite_pt(prequant_files("int8", "pt"), folder / "tag.pt", lambda o: o.__setitem__("format", tag))
    with pytest.raises(errors.ValidationError) as e:
        _open(dst)
    assert needle in str(e.value) and "tag.pt" in str(e.value)


@pytest.mark.parametrize("field,value,req,needle", [
    (None, None, {"scheme": "fp8"}, "requested 'fp8'"),
    (None, None, {"base_model_id": "black-forest-labs/FLUX.1-dev"}, "requested 'black-forest-labs/FLUX.1-dev'"),
    (None, None, {"min_features": 1024}, "min_features is 512, requested 1024"),
    ("exclude_name_tokens", ["norm"], {}, "exclude_name_tokens"),
    ("require_bf16", True, {}, "require_bf16"),
    ("min_features", "lots", {}, "expected an integer"),
])
def test_metadata_mismatch(prequant_files, folder, field, value, req, needle):
    def mutate(o):
        if field:
            o["metadata"][field] = value
    dst = _rewrite_pt(prequant_files("int8", "pt"), folder / "meta.pt", mutate)
    with pytest.raises(errors.ValidationError) as e:
        _open(dst, **req)
    assert needle in str(e.value), str(e.value)
    assert e.value.fix


def test_base_model_matches_by_tail_case_insensitive(prequant_files, allow_dir):
    allow_dir(os.path.dirname(prequant_files("int8")))
    assert _open(prequant_files("int8"), base_model_id="someone/z-image-turbo").verdict.ok
    assert _open(prequant_files("int8"), base_model_id=BASE_ID).verdict.ok


def test_all_reasons_reported_at_once(prequant_files, allow_dir):
    allow_dir(os.path.dirname(prequant_files("int8")))
    with pytest.raises(errors.ValidationError) as e:
        _open(prequant_files("int8"), scheme="fp8", base_model_id="Qwen/Qwen-Image", min_features=64)
    assert len(e.value.reasons) == 3


def test_per_tensor_fp8_refused(prequant_files, folder):
    from prequant_core.schemes import qtensor

    def mutate(o):
        sd = o["state_dict"]
        for k, v in list(sd.items()):
            if qtensor.is_quantized(v):
                q, s, _ = qtensor.split(v)
                sd[k] = type(v)(q, s.max().reshape(1, 1), [1, q.shape[1]], mm_config=v.mm_config,
                                act_quant_kwargs=v.act_quant_kwargs, kernel_preference=v.kernel_preference,
                                dtype=v.dtype)
                break
    dst = _rewrite_pt(prequant_files("fp8", "pt"), folder / "pertensor.pt", mutate)
    with pytest.raises(errors.ValidationError) as e:
        _open(dst)
    assert "per-tensor" in str(e.value)


class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_code_executing_pickle_is_not_run(folder, tmp_path):
    marker = tmp_path / "PWNED"
    p = folder / "evil.pt"
    torch.save({"format": "unsloth_prequant_transformer_state_dict_v1", "metadata": {}, "state_dict": {}}, p)
    # Replace the pickle inside the torch.save archive with one whose unpickling would run a shell command.
    with zipfile.ZipFile(p) as z:
        names = z.namelist()
        blobs = {n: z.read(n) for n in names}
    pkl = next(n for n in names if n.endswith("data.pkl"))
    blobs[pkl] = pickle.dumps({"format": "x", "metadata": {}, "state_dict": {"w": _Boom(marker)}}, protocol=2)
    with zipfile.ZipFile(p, "w") as z:
        for n in names:
            z.writestr(n, blobs[n])
    with pytest.raises(errors.UnsafeCheckpointError) as e:
        _open(p)
    assert not marker.exists(), "the payload ran"
    assert "evil.pt" in str(e.value)


def test_errors_name_file_expected_found_fix(prequant_files, folder):
    p = folder / "empty.safetensors"
    p.write_bytes(b"")
    with pytest.raises(errors.CorruptCheckpointError) as e:
        formats.read(str(p))
    assert "empty.safetensors" in str(e.value) and e.value.fix


@pytest.mark.parametrize("shape", [(3072, 64, 2), (3072,), ()])
def test_a_weight_of_the_wrong_rank_is_a_typed_error_not_a_raw_one(shape):
    """A file that passes detection but holds a 3-D (or 1-D, or scalar) tensor where a Linear's 2-D weight belongs
    (the family's config reads its shape) is refused as corrupt, naming the model."""
    from prequant_core import families
    from tools import tiny_families as tf
    shapes = {k: tuple(v.shape) for k, v in tf.meta_state_dict("flux.1", real=False).items()}
    shapes["x_embedder.weight"] = shape
    with pytest.raises(errors.CorruptCheckpointError) as e:
        families.get("flux.1").config_from_shapes(shapes, "/m/f.safetensors")
    assert "FLUX.1" in str(e.value) and "f.safetensors" in str(e.value)


def test_info_gives_the_verdict_the_loader_gives(prequant_files, folder):
    """One judge for every client (issue 34): the loader's refusal and Info's / verify's report name the same
    reasons for the same file and request."""
    import shutil
    from prequant_core import report
    p = shutil.copyfile(prequant_files("int8", "pt"), folder / "m.pt")
    req = dict(scheme="fp8", base_model_id="black-forest-labs/FLUX.1-dev")
    with pytest.raises(errors.ValidationError) as e:
        _open(p, **req)
    r = report.info(str(p), Request(**req), model_dirs=[str(folder)])
    assert not r.valid and r.reasons and r.reasons == e.value.reasons, (r.reasons, e.value.reasons)


@pytest.mark.parametrize("repo", ["a" * 300 + "/b", "unsloth/" + "b" * 89, "unsloth/x\n/y"])
def test_a_repo_id_the_hub_would_refuse_is_refused_typed_before_any_request(repo):
    # issue 39 #7: these reached huggingface_hub's own HFValidationError raw
    from prequant_core.load import sources
    with pytest.raises(errors.HubError) as e:
        sources.plan(sources.Wanted(hub_repo=repo, family="z-image"))
    assert "is not a Hugging Face repo id" in str(e.value) and "at most 96 characters" in str(e.value)
    assert "\n/y" not in str(e.value).split("\n")[0]  # one line stays one line


# ---------------------------------------------------------------------------------------------------------------
# Round 5: errors say what happened. Only a reader's own parsing failures become "damaged"; out of memory, a file that
# is not the checkpoint, and a failure after the file was judged (a bug, a ComfyUI API change) say so.

def _raised(exc, parsing=True, path="/models/prequant/x.safetensors"):
    from prequant_core.errors import reading
    with pytest.raises(Exception) as e:
        with reading(path, "loaded", parsing=parsing):
            raise exc
    return e.value


def test_out_of_memory_is_a_memory_error_not_a_damaged_file():
    from prequant_core.errors import MemoryBudgetError
    for exc in (MemoryError(), RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                torch.OutOfMemoryError("out of memory")):
        for parsing in (True, False):
            e = _raised(exc, parsing)
            assert isinstance(e, MemoryBudgetError) and "memory" in e.message and "Unload" in e.fix, e


def test_another_files_error_names_that_file_and_clears_the_checkpoint():
    from prequant_core.errors import InternalError
    missing = FileNotFoundError(2, "No such file or directory", "/comfy/text_encoders/llama_tokenizer/tokenizer.json")
    e = _raised(missing)
    assert isinstance(e, InternalError) and "tokenizer.json" in e.message and "not at fault" in e.fix
    # the checkpoint's own OSError stays the reader's: damaged or truncated
    from prequant_core.errors import CorruptCheckpointError
    own = OSError(5, "Input/output error", "/models/prequant/x.safetensors")
    assert isinstance(_raised(own), CorruptCheckpointError)
    # a name no path can be (a NUL inside: the OS call raises before it resolves) is still another file's, named
    odd = FileNotFoundError(2, "No such file or directory", "tokenizer\x00.json")
    e = _raised(odd)
    assert isinstance(e, InternalError) and "tokenizer\x00.json" in e.message, e.message
    # an OSError naming no file at all, or a read with no checkpoint path: the reader's own failure
    assert isinstance(_raised(OSError(5, "Input/output error")), CorruptCheckpointError)
    assert isinstance(_raised(missing, path=None), CorruptCheckpointError)


def test_a_failure_after_the_file_was_judged_asks_for_a_report():
    from prequant_core.errors import CorruptCheckpointError, InternalError
    bug = AttributeError("'NextDiT' object has no attribute 'norm_final'")
    e = _raised(bug, parsing=False)
    assert isinstance(e, InternalError) and "report" in e.fix and "norm_final" in e.found
    assert not isinstance(e, CorruptCheckpointError) and "Download or build the file again" not in e.fix
    assert isinstance(_raised(bug, parsing=True), CorruptCheckpointError)  # a reader on a stranger's bytes

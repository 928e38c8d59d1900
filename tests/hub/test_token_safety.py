"""A token is never written anywhere: a gated repo downloaded with the token from the environment (HF_TOKEN), the
shipped Z-Image workflow run to a saved image on a real ComfyUI server, and then the token string is in no PNG
chunk, no history entry, no log line and no file the server or the Hub client wrote."""
from __future__ import annotations

import json
import os
import secrets
import struct
import urllib.error
import urllib.request

from conftest import ROOT
from hub_server import HubServer

REPO = "unsloth/Z-Image-Turbo-FP8"
FILE = "Z-Image-Turbo-FP8.safetensors"
WORKFLOW = os.path.join(ROOT, "example_workflows", "z_image_turbo_prequant.json")


def png_chunks(path) -> list[tuple[bytes, bytes]]:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, pos = [], 8
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        out.append((kind, data[pos + 8:pos + 8 + n]))
        pos += 12 + n
    return out


def files_containing(root, needle: bytes) -> list[str]:
    hits = []
    for r, _, names in os.walk(root):
        for n in names:
            p = os.path.join(r, n)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                if needle in f.read():
                    hits.append(p)
    return hits


def test_gated_download_with_env_token_then_save_image_leaks_the_token_nowhere(tmp_path, comfy):
    from prequant_core import builder, families
    from tools import tiny_assets, tiny_models
    from tools.comfy_server import ComfyServer, execution_error
    from tools.workflow import to_api
    token = "hf_" + secrets.token_hex(16)
    hosted = tmp_path / "hosted" / FILE
    hosted.parent.mkdir()
    dense = tiny_models.zimage_dense(seed=0, cap_feat_dim=tiny_assets.CAP_FEAT_DIM)
    builder.build_from_tensors(dense, builder.Target(str(hosted)),
                               builder.Recipe("fp8", family=families.get("z-image"),
                                              base_model_id="Tongyi-MAI/Z-Image-Turbo"))
    base, hf_home = tmp_path / "comfy", tmp_path / "hf_home"
    tiny_assets.install(str(base / "models"))
    with open(WORKFLOW) as f:
        wf = json.load(f)
    with HubServer() as hub:
        hub.commit(REPO, {FILE: str(hosted)})
        hub.require_token(REPO, token)
        # the repo really is gated: without the token the Hub refuses
        req = urllib.request.Request(f"{hub.url}/{REPO}/resolve/main/{FILE}", method="HEAD")
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("the loopback Hub served a gated file without a token")
        except urllib.error.HTTPError as e:
            assert e.code == 401
        probes = len(hub.log)
        env = {"HF_TOKEN": token, "HF_ENDPOINT": hub.url, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "0",
               "PREQUANT_ALLOW_LOCAL_PATH": ""}
        with ComfyServer(str(base), env=env) as server:
            info = server.get("/object_info")
            assert "hf_token" not in info["PrequantLoadTransformer"]["input"]["optional"]
            # the workflow as shipped; only the text encoder, VAE and size are swapped for test-size ones
            prompt = to_api(wf, info, {
                "PrequantLoadTextEncoder": tiny_assets.text_encoder_stand_in(),
                "VAELoader": {"vae_name": tiny_assets.VAE_NAME},
                "EmptySD3LatentImage": {"width": 128, "height": 128},
                "KSampler": {"steps": 2},
            })
            # as the browser queues it: the UI workflow goes into the PNG too
            pid = server.post("/prompt", {"prompt": prompt, "client_id": "token-test",
                                          "extra_data": {"extra_pnginfo": {"workflow": wf}}})["prompt_id"]
            entry = server.wait(pid, timeout=600)
            assert execution_error(entry) is None, execution_error(entry) or server.log_tail()
            s = [o["prequant"][0] for o in entry["outputs"].values() if "prequant" in o][0]
            assert s["source"] == f"hub:{REPO}@main" and s["downloaded"] is True
            history = json.dumps(server.get("/history")) + json.dumps(server.get(f"/history/{pid}"))
            queue = json.dumps(server.get("/queue"))
            images = [i for o in entry["outputs"].values() for i in o.get("images", [])]
        server_log = open(server.log_path, "rb").read()
        sent = [r for r in hub.log[probes:] if r["repo"] == REPO or r["route"] == "cdn"]

    assert sent and all(r["auth"] for r in sent if r["route"] == "resolve"), "the token from the environment was used"
    assert any(r["status"] in (200, 206) for r in sent)
    assert len(images) == 1
    png = os.path.join(base, "output", images[0].get("subfolder", ""), images[0]["filename"])
    chunks = png_chunks(png)
    text = {k: v for k, v in chunks if k in (b"tEXt", b"iTXt", b"zTXt")}
    names = [v.split(b"\0", 1)[0] for k, v in chunks if k == b"tEXt"]
    assert b"prompt" in names and b"workflow" in names, names  # the graph is embedded: the check means something
    assert text
    tok = token.encode()
    assert not [k for k, v in chunks if tok in v], "the token is in a PNG chunk"
    assert token not in history and token not in queue, "the token is in the history / queue"
    assert tok not in server_log and server_log, "the token is in the server log"
    assert b"[prequant]" in server_log  # the pack's own log lines are in it
    assert files_containing(base, tok) == [], "a file the server wrote holds the token"
    assert files_containing(hf_home, tok) == [], "the Hub client stored the token"

"""Load under concurrency and repetition, on the real ComfyUI.

* a real server (tools/comfy_server.ComfyServer, set up by test_server's ``server`` fixture): two prompts loading the
  same checkpoint queued at the same moment from two clients; ``/free`` (unload models + reset caches) fired in a
  loop while prompts that load, unload and reload the pack's models run;
* headless in-process: 50 cycles of load node -> one sampling step -> ``unload_all_models`` -> gc, with the
  process's RSS recorded every cycle; after warm-up it must not grow beyond noise. The figures are printed
  (``[rss] ...``) so a regression shows its size.
"""
from __future__ import annotations

import gc
import os
import statistics
import threading
import time

import psutil
import torch

from conftest import sample
from server_kit import image_digest, prompt_for, server  # noqa: F401  (module-scoped server fixture, reused)

CYCLES = int(os.environ.get("PREQUANT_RSS_CYCLES", "50"))
WARMUP = 10
# After warm-up, live memory may move by allocator noise, never by a model: one tiny model is ~95 MB.
RSS_GROWTH_LIMIT = 48 * 2**20


def _report(request, lines):
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        print("\n" + "\n".join(lines), flush=True)


def ok(entry):
    from tools.comfy_server import execution_error
    err = execution_error(entry)
    assert err is None, err
    assert entry["status"]["status_str"] == "success"
    return entry


def pixels(server, entry) -> str:
    """Digest of the decoded image (the PNG file also embeds the prompt, which differs between the two graphs)."""
    import hashlib

    from PIL import Image
    imgs = [i for out in entry["outputs"].values() for i in out.get("images", [])]
    assert len(imgs) == 1
    with Image.open(os.path.join(server.base_dir, "output", imgs[0].get("subfolder", ""), imgs[0]["filename"])) as im:
        return hashlib.sha256(im.convert("RGB").tobytes()).hexdigest()


def loader_ran(entry) -> bool:
    return any("prequant" in out for out in entry["outputs"].values())


def test_two_prompts_loading_the_same_checkpoint_at_once(server):  # noqa: F811
    """Two clients queue prompts that load the same file (different loader inputs, so both really load it) at the
    same instant; both succeed and, having the same weights and seed, give the same image."""
    prompts = [prompt_for(server), prompt_for(server)]
    prompts[1]["1"]["inputs"]["base_model_id"] = "z-image-turbo"  # same file, same check (tail, any case)
    server.free()  # start from nothing loaded and no cached outputs
    ids, errors_ = [None, None], []
    barrier = threading.Barrier(2)

    def client(i):
        try:
            barrier.wait(10)
            ids[i] = server.queue(prompts[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors_.append(e)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors_ and all(ids), errors_
    entries = [ok(server.wait(pid, timeout=300)) for pid in ids]
    assert all(loader_ran(e) for e in entries), "a loader was served from the cache instead of loading"
    assert pixels(server, entries[0]) == pixels(server, entries[1])


def test_free_racing_loads(server, request):  # noqa: F811
    """/free (unload every model, drop every cached output) fired continuously while prompts alternate between two
    checkpoints: every prompt succeeds, each checkpoint always gives its own image, and the server's RSS stays
    bounded."""
    schemes = {"fp8": "Z-Image-Turbo-FP8.safetensors", "int8": "Z-Image-Turbo-INT8-comfykeys.pt"}
    graphs = {s: prompt_for(server, ckpt, s) for s, ckpt in schemes.items()}
    reference = {s: image_digest(server, ok(server.run(g, timeout=300))) for s, g in graphs.items()}
    proc = psutil.Process(server.proc.pid)
    rss = [proc.memory_info().rss]
    stop = threading.Event()
    frees = [0]

    def hammer():
        while not stop.is_set():
            try:
                server.free()
                frees[0] += 1
            except Exception:  # noqa: BLE001 - the server is busy; the prompts' results are what is checked
                pass
            time.sleep(0.05)
    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    try:
        order = ["fp8", "int8"] * 3
        ids = [(s, server.queue(graphs[s])) for s in order]
        for s, pid in ids:
            entry = ok(server.wait(pid, timeout=300))
            assert image_digest(server, entry) == reference[s], f"{s} gave another image after /free"
            rss.append(proc.memory_info().rss)
    finally:
        stop.set()
        t.join(10)
    assert frees[0] >= len(order), "the /free loop did not run alongside the prompts"
    ok(server.run(graphs["fp8"], timeout=300))  # and the server keeps serving
    _report(request, [f"[rss] server over {len(order)} prompts with {frees[0]} /free calls racing: "
                      f"first {rss[0] / 2**20:.0f} MiB, last {rss[-1] / 2**20:.0f} MiB, max {max(rss) / 2**20:.0f} MiB"])
    assert rss[-1] - rss[1] < 4 * 95 * 2**20, "server memory grew by several models' worth"


def _rss() -> int:
    from prequant_core.schemes import quantize
    gc.collect()
    quantize.release_free_memory()  # freed heap pages back to the OS: RSS then tracks live memory, not malloc caching
    return psutil.Process().memory_info().rss


def test_repeated_load_unload_cycles_do_not_grow(comfy, prequant_files, request):
    import comfy.model_management as mm
    import folder_paths
    nodes, _ = comfy
    name = "rss-cycle-INT8.safetensors"
    target = os.path.join(folder_paths.get_folder_paths("prequant")[0], name)
    if not os.path.exists(target):
        os.link(prequant_files("int8", "safetensors"), target)
    loader = nodes.NODE_CLASS_MAPPINGS["PrequantLoadTransformer"]()
    rss, t0 = [], time.time()
    try:
        for i in range(CYCLES):
            with torch.inference_mode():
                model = loader.load(name)["result"][0]
            out = sample(model, steps=1, size=16)
            assert torch.isfinite(out).all()
            del model, out
            mm.unload_all_models()
            mm.soft_empty_cache()
            rss.append(_rss())
    finally:
        os.unlink(target)
    base = statistics.median(rss[WARMUP:WARMUP + 10])
    tail = statistics.median(rss[-10:])
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    _report(request, [f"[rss] {CYCLES} headless load/sample/unload cycles in {time.time() - t0:.0f} s: first "
                      f"{mib(rss[0])}, after warm-up {mib(base)}, last {mib(rss[-1])}, max {mib(max(rss))}, "
                      f"growth after warm-up {mib(tail - base)} (limit {mib(RSS_GROWTH_LIMIT)})"])
    assert tail - base < RSS_GROWTH_LIMIT, f"RSS grew {mib(tail - base)} over {CYCLES - WARMUP} cycles"
    assert max(rss[WARMUP:]) - base < 2 * RSS_GROWTH_LIMIT + 95 * 2**20, "a cycle held more than one extra model"

#!/usr/bin/env bash
# Sets up the pinned dev environment if needed, then runs the whole test suite in four legs:
#   core            prequant_core alone, ComfyUI absent (tests/no_comfyui.py): CORE_TESTS below
#   comfyui-0.33.0  everything else on ComfyUI 0.33.0 (.cache/comfyui-0.33; scripts/setup_comfyui033.sh): in-process,
#                   as a server, the browser. The ComfyUI users run today (0.33-0.38): the main leg.
#   comfyui-0.3.75  COMPAT_TESTS on ComfyUI 0.3.75 (.comfyui, .venv's python): the files where the pack meets
#                   ComfyUI's internals, on the oldest ComfyUI the pack supports
#   comfyui-0.12.1  COMPAT_TESTS on ComfyUI 0.12.1 (.cache/comfyui-0.12, its own venv; scripts/setup_comfyui012.sh)
# With test paths as arguments it runs just those (one pytest run), on 0.33.0, or on 0.3.75 / 0.12.1 with
# PREQUANT_TEST_COMFYUI=0.3.75 / 0.12 in the environment, and sets up only what those files need.
#   --changed     the test files that the uncommitted and unpushed changes touch (docs/DEVELOPING.md: the quick loop)
#   --coverage    (first) measure prequant_core/ and nodes/ with coverage.py in every Python process the run starts
#                 (the pytest workers, the ComfyUI servers, the CLI and download children), merge every leg, print line
#                 and branch coverage and write .cache/coverage/gaps.md (the lines no test ran, by function)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
t_start=$SECONDS
"$root/scripts/setup_dev.sh"
coverage=0
if [ "${1:-}" = "--coverage" ]; then coverage=1; shift; fi
cov_dir="$root/.cache/coverage"
coverage_hook() {  # PYTHON: its site-packages gets a .pth starting coverage where COVERAGE_PROCESS_START is set
  [ "$coverage" -eq 1 ] || return 0
  local sp; sp="$("$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  printf '%s\nimport os; exec("if os.environ.get(\\"COVERAGE_PROCESS_START\\"):\\n import coverage; coverage.process_startup()")\n' \
    "$root/.cache/coverage-pkg" > "$sp/zz_prequant_coverage.pth"
}
coverage_report() {
  [ "$coverage" -eq 1 ] || return 0
  local cov=(env PYTHONPATH="$root/.cache/coverage-pkg" COVERAGE_PROCESS_START= "$root/.venv/bin/python" -m coverage)
  "${cov[@]}" combine -q --rcfile="$cov_dir/coveragerc" "$cov_dir/data"
  "${cov[@]}" json -q --rcfile="$cov_dir/coveragerc" -o "$cov_dir/coverage.json"
  "$root/.venv/bin/python" "$root/tools/coverage_gaps.py" "$cov_dir/coverage.json" "$root" >"$cov_dir/gaps.md"
  sed -n '1,/^## /p' "$cov_dir/gaps.md" | sed '$d'
  echo "[test] coverage: the lines no test ran, by function: $cov_dir/gaps.md"
}
if [ "$coverage" -eq 1 ]; then
  "$root/scripts/setup_test_extras.sh" coverage
  rm -rf "$cov_dir"; mkdir -p "$cov_dir/data"
  printf '[run]\nbranch = True\nparallel = True\nsigterm = True\ndata_file = %s\nsource =\n    %s\n    %s\n' \
    "$cov_dir/data/cov" "$root/prequant_core" "$root/nodes" >"$cov_dir/coveragerc"
  export COVERAGE_PROCESS_START="$cov_dir/coveragerc"
  coverage_hook "$root/.venv/bin/python"
fi

# The core tier's files (the first leg)
# (each list heaviest first, from the durations each leg prints: xdist hands files out in this order)
CORE_TESTS=(tests/families/test_unsloth_conformance.py tests/formats/test_fuzz.py tests/hub/test_hub_hostile.py tests/builder/test_build_faults.py
            tests/formats/test_hostile_files.py tests/schemes/test_block_formats.py tests/families/test_unsloth_parity.py tests/load/test_bad_input.py
            tests/test_core_tier.py tests/schemes/test_int8_cpu.py tests/schemes/test_cpu_weight_only.py tests/project/test_registry.py tests/formats/test_comfy_native.py
            tests/families/test_pages.py tests/formats/test_format_registry.py tests/project/test_readme_tables.py tests/schemes/test_scheme_registry.py
            tests/families/test_family_registry.py
            tests/project/test_harness.py tests/text_encoders/test_text_encoder_files.py tests/cli/test_cli.py tests/hub/test_comfy_twins.py
            tests/load/test_verified_cache.py tests/hub/test_hub_staging.py tests/schemes/test_lora_requant.py
            tests/text_encoders/test_text_encoder_int8.py tests/schemes/test_zero_rows.py tests/schemes/test_nan_codes.py tests/load/test_companion_source.py
            tests/hub/test_hub_errors.py tests/schemes/test_mxfp8.py tests/builder/test_output_file.py tests/text_encoders/test_encoder_checks.py
            tests/formats/test_legacy_v1_records.py tests/formats/test_comfy_native_records.py tests/formats/test_dense_sources.py
            tests/test_diffusers_loader_parts.py tests/formats/test_fingerprint.py tests/schemes/test_nvfp4.py tests/formats/test_pickle_guard.py
            tests/formats/test_pt_safe_globals.py tests/schemes/test_qtensor.py tests/test_report.py tests/load/test_sources.py
            tests/text_encoders/test_tokenizer_source.py tests/formats/test_validate_tensors.py tests/families/test_keymap_edges.py
            tests/builder/test_builder_inputs.py tests/load/test_placement_edges.py tests/load/test_route_choice.py
            tests/formats/test_container_headers.py tests/schemes/test_codec_edges.py tests/load/test_metadata_edges.py
            tests/text_encoders/test_encoder_kinds.py tests/hub/test_hub_transfer_edges.py tests/formats/test_plain_values.py
            tests/cli/test_cli_edges.py tests/load/test_opening_edges.py tests/formats/test_data_section.py tests/formats/test_format_edges.py
            tests/schemes/test_scheme_edges.py tests/builder/test_encoder_builder_edges.py tests/families/test_family_config_edges.py)
# The ComfyUI tier's heaviest files; every other test file (tests/test_*.py, tests/<room>/test_*.py) follows them.
COMFY_HEAVY=(tests/project/test_browser.py tests/nodes/test_compile.py tests/families/test_unsloth_conformance_comfy.py
             tests/test_diffusers_loader.py tests/nodes/test_concurrency.py tests/hub/test_hub.py tests/builder/test_build.py
             tests/project/test_example_workflows.py tests/nodes/test_server.py tests/families/test_families.py tests/nodes/test_loader.py
             tests/formats/test_legacy_formats.py tests/project/test_fresh_clone.py)
# The extras a test file needs beyond the dev venv (scripts/setup_test_extras.sh names them).
extras_of() {
  case "$(basename "${1%%::*}")" in
    test_browser.py) echo browser ;;
    test_browser_fold.py) echo browser frontend158 ;;
    test_load_trace.py) echo strace ;;
    test_fuzz.py | test_legacy_formats.py | test_legacy_v1_records.py) echo torchao014 ;;
    test_registry.py) echo comfy-cli ;;
    test_example_workflows.py) echo comfy-templates ;;
    test_families.py) echo diffusers042 comfy-kitchen ;;
    test_diffusers_loader.py | test_unsloth_conformance.py | test_video_sampling.py) echo diffusers042 ;;
    test_comfy_native.py | test_comfy_native_comfy.py | test_comfy_twins.py | test_dynamic_vram.py | \
      test_node_edge_inputs.py) echo comfy-kitchen ;;
    test_hub_staging.py) echo hf24 ;;
  esac
}

# torch.compile's cache stays inside the checkout like everything else the suite makes.
export TORCHINDUCTOR_CACHE_DIR="$root/.cache/torchinductor"
# Scratch files (pytest's tmp_path, the test ComfyUI roots, the browser's profile) go to a folder of this run that is
# emptied when each leg ends and removed at exit: a CI run once died with "No space left on device" when the legs'
# leftovers piled up in /tmp. It stays under /tmp, not in the checkout, because sockets made under TMPDIR (the
# browser's) must keep a path shorter than 108 bytes. A killed run's folder is removed by the next start; runs side by
# side keep their own.
for d in /tmp/prequant-test-* /tmp/prequant-setup012-*; do
  [ -d "$d" ] || continue
  kill -0 "${d##*-}" 2>/dev/null || rm -rf "$d"
done
export TMPDIR="/tmp/prequant-test-$$"
# the 0.12.1 build in the background has scratch of its own: pip's unpacking must outlive the legs' clean-ups
tmp012="/tmp/prequant-setup012-$$"
mkdir -p "$TMPDIR" "$tmp012"
trap 'rm -rf "$TMPDIR" "$tmp012"' EXIT
legs=()  # "name seconds rc" per leg, printed at the end: the suite's time in every CI log
leg_start=$t_start
leg_done() {  # NAME RC
  local took=$((SECONDS - leg_start))
  legs+=("$1 $took $2")
  printf '[test] leg %s: %d:%02d (exit %s)\n' "$1" $((took / 60)) $((took % 60)) "$2"
  rm -rf "$TMPDIR"; mkdir -p "$TMPDIR"
  df -h "$root" | awk 'NR==2 {print "[test] disk after this leg: " $4 " free"}'
  leg_start=$SECONDS
}
summary() {
  local l name took rc
  echo "[test] wall time per leg:"
  for l in "${legs[@]}"; do
    read -r name took rc <<<"$l"
    printf '[test]   %-14s %3d:%02d  exit %s\n' "$name" $((took / 60)) $((took % 60)) "$rc"
  done
  local all=$((SECONDS - t_start))
  printf '[test]   %-14s %3d:%02d\n' "total" $((all / 60)) $((all % 60))
}
c033="$root/.cache/comfyui-0.33"
run033() {  # pytest on ComfyUI 0.33.0: its venv's python (which sees .venv's packages), its source tree as COMFY
  "$root/scripts/setup_comfyui033.sh"
  coverage_hook "$c033/venv/bin/python"
  PREQUANT_COMFYUI="$c033/comfyui-0.33.0" PREQUANT_EXPECT_COMFYUI=0.33.0 \
    TORCHINDUCTOR_CACHE_DIR="$root/.cache/torchinductor033" "$c033/venv/bin/python" -m pytest "$@"
}
c012="$root/.cache/comfyui-0.12"
run012() {  # pytest on ComfyUI 0.12.1: its venv's python, tools/comfy_headless.py told where its root is
  "$root/scripts/setup_comfyui012.sh"
  coverage_hook "$c012/venv/bin/python"
  PREQUANT_COMFYUI="$c012/src" PREQUANT_EXPECT_COMFYUI=0.12.1 TORCHINDUCTOR_CACHE_DIR="$root/.cache/torchinductor012" \
    "$c012/venv/bin/python" -m pytest "$@"
}

# every test file: tests/ holds prequant_core's top-level modules' tests, tests/<room>/ those of each package room and
# nodes/, tests/project/ the project's own (tests/project/test_harness.py: the folders mirror the package)
mapfile -t ALL_TESTS < <(find tests -name node_modules -prune -o -name 'test_*.py' -print | sort)
args=("$@")
if [ "${1:-}" = "--changed" ]; then
  # Test files touched since origin/main (or HEAD when there is no remote), and the test files that import a
  # touched module of the pack by name: a quick loop, not a substitute for the whole suite.
  base="$(git rev-parse -q --verify origin/main 2>/dev/null || git rev-parse HEAD)"
  mapfile -t touched < <( { git diff --name-only "$base"; git ls-files --others --exclude-standard; } | sort -u)
  picked=()
  for f in "${touched[@]}"; do
    case "$f" in
      tests/*test_*.py) [ -f "$f" ] && picked+=("$f") ;;
      prequant_core/*.py | nodes/*.py | tools/*.py)
        mod="$(basename "${f%.py}")"
        [ "$mod" = "__init__" ] && mod="$(basename "$(dirname "$f")")"
        while IFS= read -r t; do picked+=("$t"); done < <(grep -lwE "$mod" "${ALL_TESTS[@]}" || true) ;;
    esac
  done
  mapfile -t picked < <(printf '%s\n' "${picked[@]}" | sed '/^$/d' | sort -u)
  if [ "${#picked[@]}" -eq 0 ]; then echo "[test] --changed: no test file touches the changes"; exit 0; fi
  echo "[test] --changed: ${picked[*]}"
  args=("${picked[@]}" "${@:2}")
fi

paths=()
for a in "${args[@]}"; do  # a test file, folder or node id among the arguments (option values such as no:cacheprovider are not)
  case "$a" in -*) ;; *) [ -e "${a%%::*}" ] && paths+=("$a") ;; esac
done
if [ "${#paths[@]}" -gt 0 ]; then
  need=()
  for p in "${paths[@]}"; do
    if [ -d "${p%%::*}" ]; then need=(all); break; fi
    read -ra e <<<"$(extras_of "$p")"; need+=("${e[@]}")
  done
  if [ "${need[*]:-}" = "all" ]; then "$root/scripts/setup_test_extras.sh"
  elif [ "${#need[@]}" -gt 0 ]; then "$root/scripts/setup_test_extras.sh" "${need[@]}"; fi
  all_core=1  # core-tier files alone run as in the core leg: ComfyUI taken away
  for p in "${paths[@]}"; do
    is_core=0
    for c in "${CORE_TESTS[@]}"; do [ "${p%%::*}" = "$c" ] && is_core=1; done
    [ "$is_core" -eq 1 ] || all_core=0
  done
  r=0
  if [ "${PREQUANT_TEST_COMFYUI:-}" = "0.12" ]; then run012 "${args[@]}" || r=$?
  elif [ "$all_core" -eq 1 ]; then PYTHONPATH="$root/tests" .venv/bin/python -m pytest -p no_comfyui "${args[@]}" || r=$?
  elif [ "${PREQUANT_TEST_COMFYUI:-}" = "0.3.75" ]; then .venv/bin/python -m pytest "${args[@]}" || r=$?
  else run033 "${args[@]}" || r=$?; fi
  coverage_report
  exit "$r"
fi

"$root/scripts/setup_test_extras.sh"
leg_done set-up 0
# ComfyUI 0.12.1's venv is built (once) while the first two legs run: it is mostly file copying.
log012="$root/.cache/setup-comfyui012.log"
mkdir -p "$root/.cache"
TMPDIR="$tmp012" "$root/scripts/setup_comfyui012.sh" >"$log012" 2>&1 &
pid012=$!
# Each leg runs on both cores: pytest-xdist, a test file per worker (module fixtures and servers are built once),
# heaviest files first so that no long file starts last. PREQUANT_TEST_WORKERS=0 runs a leg in one process.
workers="${PREQUANT_TEST_WORKERS:-2}"
par=()
if [ "$workers" -gt 1 ]; then
  par=(-n "$workers" --dist loadfile --no-loadscope-reorder)
  # one compute thread per process: two workers each running torch's default two threads on two cores (plus the
  # 0.12.1 build) measured 3x slower in the conformance files than one worker alone. Every process of the run
  # (workers, the servers and children they start) inherits it, so results computed here and in a child agree.
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
echo "[test] core tier: prequant_core without ComfyUI (${#CORE_TESTS[@]} files)"
rc=0
# the slowest tests of each leg are listed at its end: where the suite's time goes, in every CI log
slow=(--durations=12)
r=0; PYTHONPATH="$root/tests" .venv/bin/python -m pytest -p no_comfyui "${par[@]}" "${slow[@]}" "${CORE_TESTS[@]}" "$@" \
  || r=$?
leg_done core "$r"; [ "$r" -eq 0 ] || rc=$r
echo "[test] ComfyUI tier: the real ComfyUI 0.33.0 in-process, as a server, and in the browser"
"$root/scripts/setup_comfyui033.sh"
COMFY_TESTS=()  # every other test file, the heaviest first
for f in "${COMFY_HEAVY[@]}" "${ALL_TESTS[@]}"; do
  skip=0
  for c in "${CORE_TESTS[@]}" "${COMFY_TESTS[@]}"; do [ "$f" = "$c" ] && skip=1; done
  [ "$skip" -eq 1 ] || COMFY_TESTS+=("$f")
done
r=0; run033 "${par[@]}" "${slow[@]}" "${COMFY_TESTS[@]}" "$@" || r=$?
leg_done comfyui-0.33.0 "$r"; [ "$r" -eq 0 ] || rc=$r
# The files where the pack meets ComfyUI's internals, again on the older ComfyUIs users still run: 0.3.75 (.comfyui,
# .venv's python) and 0.12.1 (pip-installable distribution, its own venv with the same torch and torchao pins): model
# classes and configs of every family, folders and file lists, ModelPatcher / LoRA / low-VRAM loading, matmul paths,
# the dense fallback, nodes over a real server; chosen to keep .ci/run short on 2 cores. Not run there (covered on
# 0.33.0, the same code on either side of the ComfyUI contact points):
#   test_browser.py      0.12.1's distribution is started with an empty --front-end-root: its front end is another
#                        package than 0.33's and is not what this machine's browser scripts drive
#   test_example_workflows.py, test_hub*.py, test_token_safety.py: the Hub client and its local test hub, which are
#                        ComfyUI-independent (the 0.12.1 venv carries another huggingface_hub)
#   test_compile.py, test_concurrency.py, test_build.py, test_diffusers_loader.py, test_legacy_formats.py,
#   test_memory_guard.py, test_path_safety.py, test_fresh_process.py: same ComfyUI contact points as the files
#                        below, heavier
#   test_families.py::test_prequant_equals_load_time_quantization: the quantizer across families (ComfyUI-independent,
#                        ~4 min); the families' ComfyUI classes and configs are checked by the other tests
# and on 0.12.1 only:
#   test_text_encoder_server.py::test_the_preset_downloads_by_unsloths_name_and_later_runs_need_no_hub: the Hub
#                        client again (its refusals through the 0.12.1 server run)
#   the two stock-LoRA strength-0 checks (test_loader / test_matmul_path) and the CLIP built after another branch's
#                        LoRA (test_text_encoder_comfy): 0.12.1's distribution keeps "which patches are on the
#                        weights" per ModelPatcher copy instead of on the shared model, so a clone used after a LoRA'd
#                        clone is not unpatched (nor can the pack see that it is patched); a stock dense Linear stays
#                        patched there too
COMPAT_TESTS=(tests/nodes/test_server.py tests/families/test_families.py tests/nodes/test_loader.py tests/schemes/test_matmul_path.py
              tests/test_info.py tests/schemes/test_block_formats_comfy.py tests/project/test_comfyui_version.py tests/load/test_fallback.py
              tests/formats/test_comfy_native_comfy.py tests/text_encoders/test_text_encoder_comfy.py tests/text_encoders/test_text_encoder_server.py
              tests/nodes/test_lora_rows.py)
COMPAT_DESELECT=(--deselect tests/families/test_families.py::test_prequant_equals_load_time_quantization)
COMFY012_DESELECT=("${COMPAT_DESELECT[@]}"
                   --deselect tests/nodes/test_loader.py::test_stock_lora_loader_on_quantized_weights
                   --deselect tests/text_encoders/test_text_encoder_server.py::test_the_preset_downloads_by_unsloths_name_and_later_runs_need_no_hub
                   --deselect tests/schemes/test_matmul_path.py::test_weight_only_stock_lora
                   --deselect tests/text_encoders/test_text_encoder_comfy.py::test_build_from_a_clip_refuses_its_lora_and_reads_pristine_weights_after_another_branchs_lora)
echo "[test] ComfyUI 0.3.75 tier: ${#COMPAT_TESTS[@]} files on the real ComfyUI 0.3.75, in-process and as a server"
r=0; PREQUANT_EXPECT_COMFYUI=0.3.75 .venv/bin/python -m pytest "${par[@]}" "${slow[@]}" "${COMPAT_TESTS[@]}" \
  "${COMPAT_DESELECT[@]}" "$@" || r=$?
leg_done comfyui-0.3.75 "$r"; [ "$r" -eq 0 ] || rc=$r
r=0; wait "$pid012" || r=$?
cat "$log012"
leg_done set-up-0.12.1 "$r"; [ "$r" -eq 0 ] || { echo "[test] ComfyUI 0.12.1 did not set up (above)" >&2; summary; exit "$r"; }
echo "[test] ComfyUI 0.12.1 tier: ${#COMPAT_TESTS[@]} files on the real ComfyUI 0.12.1, in-process and as a server"
r=0; run012 "${par[@]}" "${slow[@]}" "${COMPAT_TESTS[@]}" "${COMFY012_DESELECT[@]}" "$@" || r=$?
leg_done comfyui-0.12.1 "$r"; [ "$r" -eq 0 ] || rc=$r
summary
coverage_report
exit "$rc"

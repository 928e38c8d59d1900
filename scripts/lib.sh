# Sourced by the set-up scripts.
# pipq CMD...: runs a pip command quietly; pip's "Location" warnings (a --target install outside the venv) are dropped,
# anything else it says is shown, and a failure stops the set-up here with pip's own message instead of surfacing
# later as an import error.
pipq() {
  local log rc=0
  log="$(mktemp)"
  "$@" >"$log" 2>&1 || rc=$?
  grep -v '^WARNING: Location' "$log" >&2 || true
  rm -f "$log"
  if [ "$rc" -ne 0 ]; then
    echo "[setup] failed (exit $rc): $*" >&2
    exit "$rc"
  fi
}

# shared_dir ROOT NAME: the folder ../shared/NAME (holding setup.sh) beside the checkout ROOT, or "" when absent. The
# archives sit in ../shared beside the checkout; a clone made elsewhere (CI's clean clone of main) finds them beside
# the repository it was cloned from, or where PREQUANT_SHARED points.
shared_dir() {
  local root="$1" name="$2" cand
  local origin; origin="$(git -C "$root" config --get remote.origin.url 2>/dev/null || true)"
  for cand in "${PREQUANT_SHARED:-}" "$root/../shared" "${origin:+$origin/../shared}"; do
    if [ -n "$cand" ] && [ -f "$cand/$name/setup.sh" ]; then (cd "$cand/$name" && pwd); return 0; fi
  done
  echo ""
}

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

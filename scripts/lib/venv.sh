# Sourced by scripts/serve and scripts/test: make .venv (if missing) and install the project into it.
# ensure_venv EXTRAS [--online]: without --online, Hugging Face is set offline (HF_HUB_OFFLINE=1).
#
# torch is pinned here, not in pyproject.toml: the package accepts any torch>=2.1, but an
# unpinned install can pull a multi-GB CUDA build.  ZBATCH_TORCH overrides the pin, e.g.
# ZBATCH_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu124" on a GPU host.
# Installs are skipped when pyproject.toml and the pin have not changed since the last one and the extras installed
# then take those asked for (scripts/lib/extras.py: bench takes test), so scripts/test after scripts/bench installs
# nothing. Extras are only added: a venv asked for others gets both.

ensure_venv() {
    local extras=$1
    local root venv stamp pins installed
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    venv=${ZBATCH_VENV:-$root/.venv}
    stamp=$venv/.zbatch-installed
    pins="$(sha256sum "$root/pyproject.toml" | cut -c1-16) ${ZBATCH_TORCH:-torch==2.13.0}"
    if [ ! -x "$venv/bin/python" ]; then
        echo "zbatch: creating $venv" >&2
        python3 -m venv "$venv"
    fi
    installed=$(cat "$stamp" 2>/dev/null || true)
    if [ "${installed#* }" != "$pins" ] \
        || ! "$venv/bin/python" "$root/scripts/lib/extras.py" "$root/pyproject.toml" "${installed%% *}" "$extras"; then
        [ "${installed#* }" = "$pins" ] && extras="${installed%% *},$extras"
        echo "zbatch: installing zbatch[$extras] into $venv (first run takes a few minutes)" >&2
        "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
        # shellcheck disable=SC2086  # ZBATCH_TORCH may carry pip options
        "$venv/bin/python" -m pip install --quiet ${ZBATCH_TORCH:-torch==2.13.0} >&2
        "$venv/bin/python" -m pip install --quiet -e "$root[$extras]" >&2
        echo "$extras $pins" > "$stamp"
    fi
    export PATH="$venv/bin:$PATH"
    # The project's own modules, byte-compiled ahead (only those changed since): where PYTHONDONTWRITEBYTECODE is
    # set, as on CI hosts, every daemon and test process would otherwise compile each module it imports anew.
    "$venv/bin/python" -m compileall -q -j 0 "$root/zbatch" "$root/broker" "$root/worker" "$root/gateway" \
        "$root/scripts" >/dev/null || echo "zbatch: some modules could not be byte-compiled; they compile on import" >&2
    # Tests and benchmarks download nothing; scripts/serve passes --online, since a model named by its Hub id
    # may have to be downloaded once (the caller's HF_HUB_OFFLINE still holds).
    if [ "${2:-}" != "--online" ]; then
        export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    fi
}

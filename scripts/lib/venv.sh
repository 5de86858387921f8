# Sourced by scripts/serve and scripts/test: make .venv (if missing) and install the project into it.
# ensure_venv EXTRAS [--online]: without --online, Hugging Face is set offline (HF_HUB_OFFLINE=1).
#
# torch is pinned here, not in pyproject.toml: the package accepts any torch>=2.1, but an
# unpinned install can pull a multi-GB CUDA build.  ZBATCH_TORCH overrides the pin, e.g.
# ZBATCH_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu124" on a GPU host.
# Installs are skipped when pyproject.toml and the pin have not changed since the last one and the extras installed
# then take those asked for (scripts/lib/extras.py: bench takes test), so scripts/test after scripts/bench installs
# nothing. Extras are only added: a venv asked for others gets both.
# uv installs where it can be had (on the PATH, or kept in ~/.cache/zbatch/tools/uv, put there once by pip): from
# its cache a fresh venv takes seconds, where pip took minutes. Without it, pip installs as before.
# Modules are byte-compiled on their first import (PYTHONDONTWRITEBYTECODE is lifted for what runs here), not all
# ahead: a venv holds some 19,000 modules, and the suite imports about a tenth of them.

ensure_venv() {
    local extras=$1
    local root venv stamp pins installed
    local torch=${ZBATCH_TORCH:-torch==2.13.0}  # the pin, or what ZBATCH_TORCH says instead: installer options too
    local uv  # unset until an install needs it
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    venv=${ZBATCH_VENV:-$root/.venv}
    stamp=$venv/.zbatch-installed
    pins="$(sha256sum "$root/pyproject.toml" | cut -c1-16) $torch"
    if [ ! -x "$venv/bin/python" ]; then
        echo "zbatch: creating $venv" >&2
        uv=$(_uv)
        if [ -n "$uv" ]; then "$uv" venv --quiet --seed --python python3 "$venv"; else python3 -m venv "$venv"; fi
    fi
    installed=$(cat "$stamp" 2>/dev/null || true)
    if [ "${installed#* }" != "$pins" ] \
        || ! "$venv/bin/python" "$root/scripts/lib/extras.py" "$root/pyproject.toml" "${installed%% *}" "$extras"; then
        [ "${installed#* }" = "$pins" ] && extras="${installed%% *},$extras"
        [ -n "${uv+set}" ] || uv=$(_uv)
        echo "zbatch: installing zbatch[$extras] into $venv${uv:+ with uv} (a first run takes minutes)" >&2
        if [ -z "$uv" ] || ! _uv_install "$uv" "$venv" "$torch" "$root[$extras]"; then
            [ -z "$uv" ] || echo "zbatch: uv could not install it (its output above); pip installs" >&2
            # shellcheck disable=SC2086  # $torch may carry pip options
            "$venv/bin/python" -m pip install --quiet --upgrade pip >&2
            "$venv/bin/python" -m pip install --quiet $torch >&2
            "$venv/bin/python" -m pip install --quiet -e "$root[$extras]" >&2
        fi
        echo "$extras $pins" > "$stamp"
    fi
    export PATH="$venv/bin:$PATH"
    unset PYTHONDONTWRITEBYTECODE
    # Tests and benchmarks download nothing; scripts/serve passes --online, since a model named by its Hub id
    # may have to be downloaded once (the caller's HF_HUB_OFFLINE still holds).
    if [ "${2:-}" != "--online" ]; then
        export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    fi
}

# The uv to install with: the one on the PATH, else one kept in the zbatch cache (installed there by pip once, into a
# scratch folder first, so that runs side by side never see half of it); nothing where neither can be had.
_uv() {
    local tool scratch
    if command -v uv >/dev/null 2>&1; then command -v uv; return 0; fi
    tool=${XDG_CACHE_HOME:-$HOME/.cache}/zbatch/tools/uv
    if [ ! -x "$tool/bin/uv" ]; then
        mkdir -p "$(dirname "$tool")"
        scratch=$(mktemp -d "$tool.XXXXXX")
        if python3 -m pip install --quiet --retries 0 --timeout 20 --target "$scratch" uv >/dev/null 2>&1 && [ -x "$scratch/bin/uv" ]; then
            mv -T "$scratch" "$tool" 2>/dev/null || rm -rf "$scratch"  # another run's copy may be there first
        else
            rm -rf "$scratch"
            echo "zbatch: uv could not be installed; pip installs" >&2
        fi
    fi
    if [ -x "$tool/bin/uv" ]; then echo "$tool/bin/uv"; fi
    return 0
}

# _uv_install UV VENV TORCH PROJECT: TORCH (the pin, maybe with installer options), then PROJECT, into VENV with UV; fails as soon as a step does
# (a host whose package index only pip's configuration names, say), so that pip can install instead.
_uv_install() {
    local uv=$1 python=$2/bin/python links=() link
    for link in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$link"); done  # where this host keeps wheels
    # shellcheck disable=SC2086  # $3 may carry installer options
    "$uv" pip install --quiet --python "$python" "${links[@]}" $3 >&2 \
        && "$uv" pip install --quiet --python "$python" "${links[@]}" -e "$4" >&2
}

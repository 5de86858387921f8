# Sourced by scripts/test: install a command-line tool from Debian's packages when it is missing.
#
# Best effort: without root, apt-get or a network the tool stays missing, and the tests that
# use it fall back to what they can check without it (each says how).

ensure_tool() {
    local command=$1 package=$2
    command -v "$command" >/dev/null && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "zbatch: $command not found (apt-get install $package provides it)" >&2
        return 0
    fi
    echo "zbatch: installing $command (apt-get install $package)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$package"; } >&2 \
        || echo "zbatch: could not install $package; going on without $command" >&2
}

"""The broker daemon, its wire protocol, and the client everyone uses to talk to it."""

from broker import native as _native

# Before any submodule is imported: ZBATCH_NATIVE_DIR may point the hot path at a compiled build.
NATIVE_STATUS = _native.status_from_environment(__path__)

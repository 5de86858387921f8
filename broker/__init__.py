"""The broker daemon: a sans-I/O routing core (``core``, ``state``, ``limits``) and its ZeroMQ shell."""

from zbatch.runtime import native as _native

# Before any submodule is imported: ZBATCH_NATIVE_DIR may point the hot path at a compiled build.
NATIVE_STATUS = _native.activate_from_environment(__path__, __name__)

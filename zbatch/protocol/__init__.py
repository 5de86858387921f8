"""The zbatch wire protocol: :mod:`~zbatch.protocol.wire` (messages) and
:mod:`~zbatch.protocol.payloads` (model inputs and outputs); ``PROTOCOL.md`` is the spec."""

from zbatch.runtime import native as _native

# Before ``wire`` is imported: ZBATCH_NATIVE_DIR may point it at a compiled build.
_native.activate_from_environment(__path__, __name__)

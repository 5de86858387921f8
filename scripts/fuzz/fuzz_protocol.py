"""Coverage-guided fuzzing of the wire protocol with atheris (libFuzzer); run it with scripts/fuzz/run.

Each input is one multipart message: its frames joined by :data:`SEPARATOR`.  Every
decoder gets the frames, every frame goes to the payload decoder, and a fresh
broker core gets them both as a client and as a worker message.  ProtocolError
is the one exception allowed; anything else is a crash, which libFuzzer saves
(``crash-*``) and reports with a non-zero exit status.  Replay a saved input
with ``scripts/fuzz/run path/to/crash-...``.

``--write-seeds DIR`` writes the valid messages of PROTOCOL.md section 9 as the
seed corpus and exits.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import atheris

# Only zbatch's own code is instrumented: numpy and friends would make the start slow and the coverage noisy.
with atheris.instrument_imports(include=["broker"]):
    from broker.core import BrokerCore, CoreSettings
    from zbatch.protocol import payloads, wire
    from zbatch.protocol.wire import ModelInfo, ProtocolError, Ready

SEPARATOR = b"\xffZB|"
DECODERS = (wire.decode_client_message, wire.decode_worker_message,
            wire.decode_broker_to_worker, wire.decode_reply)
CONFIG = CoreSettings(models=("m",), max_backlog=16, timeout_ms=1000, max_message_bytes=4096)


class Clock:
    """Time moves only when the target says so: a crash replays exactly."""

    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_input(data: bytes) -> None:
    frames = data.split(SEPARATOR)
    for decode in DECODERS:
        try:
            decode(list(frames))
        except ProtocolError:
            pass
    for frame in frames:
        try:
            payloads.decode_payload(frame)
        except ProtocolError:
            pass
    clock = Clock()
    core = BrokerCore(CONFIG, clock)
    core.worker_message(b"W", wire.encode_ready(Ready((ModelInfo("m", "embeddings", 4),), 8)))
    core.client_message(b"C", list(frames))
    core.worker_message(b"W", list(frames))
    clock.now += 5
    core.tick()


def write_seeds(directory: Path) -> None:
    from tests.zbatch.protocol_examples import EXAMPLES

    directory.mkdir(parents=True, exist_ok=True)
    for name, frames in EXAMPLES.items():
        (directory / name).write_bytes(SEPARATOR.join(frames))


def main() -> None:
    if sys.argv[1:2] == ["--write-seeds"]:
        write_seeds(Path(sys.argv[2]))
        return
    logging.disable(logging.CRITICAL)  # the core logs each malformed message: noise at thousands per second
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

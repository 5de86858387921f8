"""``zbatch-keys DIR NAME``: make a CURVE key pair, DIR/NAME.key (public) and DIR/NAME.key_secret.

The public file goes into the allow-list folder of the broker socket the peer
uses (clients and gateways: ``curve_clients_dir``; workers: ``curve_workers_dir``),
or, for the broker's own pair, to every peer as ``curve_server_key_file``.  The
secret file stays with its owner: it is written readable by its owner only, and
an existing pair is never overwritten.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import zmq.auth


def make_key_pair(folder: Path, name: str) -> tuple[Path, Path]:
    """Both files' paths; FileExistsError if either exists already."""
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise FileExistsError(f"{path} exists; remove it first or pick another name")
    folder.mkdir(parents=True, exist_ok=True)
    old_umask = os.umask(0o077)  # the secret half is never readable by others, not even for a moment
    try:
        zmq.auth.create_certificates(folder, name)
    finally:
        os.umask(old_umask)
    public.chmod(0o644)
    return public, secret


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zbatch-keys", description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("folder", metavar="DIR", type=Path, help="where to write the two files")
    parser.add_argument("name", metavar="NAME", help="the pair's name, e.g. broker, gateway1 or HOST-gpu0")
    args = parser.parse_args(argv)
    if not args.name or "/" in args.name or args.name.startswith("."):
        parser.error("NAME must be a plain file name")
    try:
        public, secret = make_key_pair(args.folder, args.name)
    except OSError as exc:
        sys.exit(f"zbatch-keys: error: {exc}")
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")


if __name__ == "__main__":
    main()

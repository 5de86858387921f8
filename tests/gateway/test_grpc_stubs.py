"""The KServe v2 gRPC stubs the gateway commits are what grpcio-tools generates from the protos beside them,
Triton's ModelConfig messages are Triton's on the wire, and every error code has a gRPC status."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc

from gateway.errors import ERRORS
from gateway.kserve_grpc.statuses import STATUSES

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "gateway" / "kserve_grpc"
GENERATED = ("grpc_predict_v2_pb2.py", "grpc_predict_v2_pb2.pyi", "model_config_pb2.py", "model_config_pb2.pyi")
# The published proto (kserve/kserve, docs/predict-api/v2/grpc_predict_v2.proto), as committed.
PROTO_SHA256 = "408092a3cfb737c1be17e47211fd6b072211839f61d133af6512e64d4efcca04"


def test_the_proto_is_the_published_one() -> None:
    proto = (FOLDER / "grpc_predict_v2.proto").read_bytes()
    assert hashlib.sha256(proto).hexdigest() == PROTO_SHA256
    for method in ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer"):
        assert f"rpc {method}(".encode() in proto


def test_the_committed_stubs_are_what_grpcio_tools_generates(tmp_path: Path) -> None:
    script = ROOT / "scripts" / "generate-grpc"
    subprocess.run(["bash", str(script), str(tmp_path)], check=True, cwd=ROOT,
                   env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    for name in GENERATED:
        fresh = (tmp_path / "gateway" / "kserve_grpc" / name).read_text()
        assert fresh == (FOLDER / name).read_text(), f"{name} differs from what the proto generates: run " \
                                                     "scripts/generate-grpc and commit what it writes"


# Each message's fields, by name: (number, type, label, the name of its message or enum type, unqualified).
DESCRIBE = """
import json, sys
from importlib import import_module
def fields(message):
    return {f.name: [f.number, f.type, f.label,
                     (f.message_type or f.enum_type).name if (f.message_type or f.enum_type) else None]
            for f in message.fields}
found = {}
for module in sys.argv[1:]:
    stubs = import_module(module)
    for name, message in stubs.DESCRIPTOR.message_types_by_name.items():
        found[name] = fields(message)
    for name, enum in stubs.DESCRIPTOR.enum_types_by_name.items():
        found[name] = {value.name: value.number for value in enum.values}
print(json.dumps(found))
"""


def described(*modules: str) -> dict[str, Any]:
    """The messages and enums of these stub modules, read in a fresh interpreter (tritonclient's stubs and the
    gateway's register the same names in protobuf's default pool)."""
    run = subprocess.run([sys.executable, "-c", DESCRIBE, *modules], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    found: dict[str, Any] = json.loads(run.stdout)
    return found


def test_triton_model_config_messages_are_tritons_on_the_wire() -> None:
    """Every field the gateway's ModelConfig messages have, Triton's have: same number, type and label."""
    ours = described("gateway.kserve_grpc.model_config_pb2")
    tritons = described("tritonclient.grpc.model_config_pb2", "tritonclient.grpc.service_pb2")
    assert {"ModelConfigRequest", "ModelConfigResponse", "ModelConfig", "ModelInput", "ModelOutput",
            "DataType"} <= set(ours)
    for name, fields in ours.items():
        differing = {field: (shape, tritons[name].get(field)) for field, shape in fields.items()
                     if tritons[name].get(field) != shape}
        assert differing == {}, name


def test_every_error_code_has_a_grpc_status() -> None:
    assert set(STATUSES) == set(ERRORS)
    assert STATUSES["overloaded"] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert {STATUSES[code] for code in ("no_worker", "broker_unavailable", "worker_lost")} == {
        grpc.StatusCode.UNAVAILABLE}


def test_the_gateway_loads_grpc_only_to_serve_it() -> None:
    """Without a gRPC port the gateway needs no grpcio, and its stubs stay out of a process that imports
    tritonclient.grpc's (the same protobuf package: one process cannot load both)."""
    code = ("import sys, gateway.server, gateway.app, gateway.processes; "
            "print(','.join(m for m in ('grpc', 'gateway.kserve_grpc.grpc_predict_v2_pb2') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""

"""A worker's models made local folders before anything loads (worker/sources.py): each way a model cannot be had
ends the worker at start with one line and exit status 78; code of the model's own runs only when allowed.

The worker runs as a process, as an operator starts it, against a Hugging Face cache built on disk (offline)
or against the fake Hub of tests/hub.py (online: a gated model, a revision the Hub does not have) or a closed
port (no network).  It fails before torch is imported, so each case costs about a second.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub import GATED_ID, MODEL_ID, FakeHub, cache_env
from tests.worker.tiny_models import make_tiny_bert
from worker.runners.spec import ModelSpec
from worker.sources import check_model_folder
from zbatch.hub import CONFIG_EXIT_CODE, ModelUnavailable
from zbatch.testing import ROOT, daemon_env, endpoint

OWN_TYPE = "zbatch-own-bert"
OWN_CONFIG = f"""from transformers import BertConfig


class OwnConfig(BertConfig):
    model_type = "{OWN_TYPE}"
"""
OWN_MODEL = """from transformers import BertModel

from .configuration_own import OwnConfig


class OwnModel(BertModel):
    config_class = OwnConfig
"""


def with_own_code(folder: str) -> str:
    """The tiny BERT at ``folder`` as a model that brings its own code: a model_type transformers does not know,
    whose Auto classes are modules of the folder (config.json's auto_map), as on the Hub."""
    path = Path(folder)
    config = json.loads((path / "config.json").read_text())
    config |= {"model_type": OWN_TYPE, "architectures": ["OwnModel"],
               "auto_map": {"AutoConfig": "configuration_own.OwnConfig", "AutoModel": "modeling_own.OwnModel"}}
    (path / "config.json").write_text(json.dumps(config))
    (path / "configuration_own.py").write_text(OWN_CONFIG)
    (path / "modeling_own.py").write_text(OWN_MODEL)
    return folder


@pytest.fixture
def cache(hub_cache: Path) -> Path:
    return hub_cache


@pytest.fixture(scope="module")
def own_code(tmp_path_factory: pytest.TempPathFactory) -> str:
    return with_own_code(make_tiny_bert(tmp_path_factory.mktemp("own"), "feature-extraction"))


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    return fake_hub


def worker_fails(*args: str, env: dict[str, str]) -> str:
    """Run ``zbatch-worker ARGS``, which must exit 78 at start; its last line."""
    done = subprocess.run([sys.executable, "-m", "worker", "--backend", endpoint(), *args], env=daemon_env(env),
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == CONFIG_EXIT_CODE, done
    return done.stderr.strip().splitlines()[-1]


# ------------------------------------------------------------------------------------------- each failure, its line


def test_offline_an_id_or_a_revision_not_in_the_cache(cache: Path) -> None:
    assert worker_fails("--model", "org/absent", env=cache_env(cache)) == (
        f"zbatch-worker: error: model 'org/absent' is not in the Hugging Face cache {cache}, and HF_HUB_OFFLINE=1 "
        f"forbids downloading it: download it once with a connection (hf download org/absent), or unset "
        f"HF_HUB_OFFLINE")
    line = worker_fails("--model", MODEL_ID, "--revision", "v9", env=cache_env(cache))
    assert line.startswith(f"zbatch-worker: error: model '{MODEL_ID}' at revision 'v9' is not in the Hugging Face "
                           f"cache {cache}; the cache holds main, v1.0, "), line


def test_a_folder_that_does_not_exist_or_holds_no_model(cache: Path, tmp_path: Path) -> None:
    assert worker_fails("--model", str(tmp_path / "absent"), env=cache_env(cache)) == (
        f"zbatch-worker: error: model folder '{tmp_path / 'absent'}' does not exist: name a folder that holds a "
        f"model, or a Hugging Face Hub id such as sentence-transformers/all-MiniLM-L6-v2")
    assert worker_fails("--model-path", str(tmp_path), env=cache_env(cache)) == (
        f"zbatch-worker: error: model '{tmp_path.name}': {tmp_path} holds no transformers model (it has no "
        f"config.json); name the folder of a model, or its Hub id"), "the deprecated model_path too"


def test_a_model_with_code_of_its_own_needs_trust_remote_code(cache: Path, own_code: str) -> None:
    assert worker_fails("--model", own_code, env=cache_env(cache)) == (
        f"zbatch-worker: error: model 'tiny-bert-feature-extraction' needs Python code of its own (model_type "
        f"'{OWN_TYPE}', which transformers does not know; auto_map: configuration_own.OwnConfig, "
        f"modeling_own.OwnModel), which zbatch runs only when told to: read that code, then set "
        f"--trust-remote-code (ZBATCH_TRUST_REMOTE_CODE=true) if you trust it")


def test_the_hubs_refusals_and_no_network(hub: FakeHub, tmp_path: Path) -> None:
    online = {"HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": hub.url}
    assert worker_fails("--model", GATED_ID, env=online) == (  # the fake Hub's 401 GatedRepo, as the Hub answers
        f"zbatch-worker: error: model '{GATED_ID}' is gated on the Hub, and this host has no token with access to it: "
        f"accept its conditions at {hub.url}/{GATED_ID}, then give the workers a token (HF_TOKEN, or `hf auth login` "
        f"as their user)")
    assert worker_fails("--model", MODEL_ID, "--revision", "v9", env=online) == (
        f"zbatch-worker: error: model '{MODEL_ID}' has no revision 'v9' on the Hub: name a branch, tag or commit it "
        f"has ({hub.url}/{MODEL_ID}/tree/main lists them)")
    closed = online | {"HF_ENDPOINT": "http://127.0.0.1:9"}
    line = worker_fails("--model", MODEL_ID, env=closed)
    assert line.startswith("zbatch-worker: error: cannot reach the Hugging Face Hub at http://127.0.0.1:9 "), line
    assert line.endswith(f"and model '{MODEL_ID}' is not in the cache {tmp_path / 'hub'}: check the network (or "
                         f"HF_ENDPOINT, a proxy), or copy the model into the cache"), line


# ------------------------------------------------------------------------------------------- the checks themselves


def test_the_checks_pass_a_model_transformers_knows_whatever_its_auto_map(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    spec = ModelSpec("m", str(folder))
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "auto_map": {"AutoModel": "x.Y"}}))
    check_model_folder(str(folder), spec)  # transformers loads its own BertModel, as it would
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelUnavailable, match=r"config\.json is not a JSON object"):
        check_model_folder(str(folder), spec)
    (folder / "config.json").write_text("{")
    with pytest.raises(ModelUnavailable, match=r"cannot read .*config\.json"):
        check_model_folder(str(folder), spec)
    check_model_folder(str(folder), ModelSpec("m", str(folder), task="python:my.module:Runner"))  # its own rules


def test_trust_remote_code_loads_the_models_own_code(own_code: str, tmp_path: Path) -> None:
    """Allowed, the model's own classes serve it (in a process of its own: transformers copies them into
    HF_MODULES_CACHE, here a folder of the test's)."""
    code = ("import sys; from worker.runners import ModelSpec, load_runner; "
            "runner = load_runner(ModelSpec('own', sys.argv[1], device='cpu', trust_remote_code=True)); "
            "print(type(runner._model).__name__, len(runner.run(['hello world'], {})[0]))")
    done = subprocess.run([sys.executable, "-c", code, own_code], cwd=ROOT, capture_output=True, text=True,
                          env=daemon_env({"HF_MODULES_CACHE": str(tmp_path / "modules")}), timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["OwnModel", "32"], done.stdout

"""A model setting made a local folder (zbatch/hub.py): Hub ids from a Hugging Face cache built on disk and read
offline, and from a fake Hub on a local port for a cold cache and the Hub's refusals; folders; each failure's line.

No test reaches the network: the offline ones read a cache built from the bundled model (tests/hub.py), the
online ones talk to :class:`tests.hub.FakeHub` or to a closed local port.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub import COMMIT, GATED_ID, MODEL_ID, TAG, FakeHub, files_of
from zbatch.hub import (
    BUNDLED_MODEL_NAME,
    ModelUnavailable,
    bundled_model_path,
    fetch,
    is_hub_id,
    public_name,
)
from zbatch.testing import ROOT, daemon_env

CLOSED = "http://127.0.0.1:9"  # the discard port, closed: a Hub that cannot be reached


@pytest.fixture
def cache(hub_cache: Path) -> Path:
    return hub_cache


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub in this process as on a host with a connection (the tests run with HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    return fake_hub


def unavailable(setting: str, revision: str = "", cache_dir: str | None = None, endpoint: str | None = None) -> str:
    with pytest.raises(ModelUnavailable) as raised:
        fetch(setting, revision, cache_dir=cache_dir, endpoint=endpoint)
    return str(raised.value)


# ------------------------------------------------------------------------------------------- names


def test_the_public_name_is_the_hub_id_the_folder_name_or_the_bundled_models(tmp_path: Path) -> None:
    assert public_name("") == BUNDLED_MODEL_NAME
    assert public_name(MODEL_ID) == MODEL_ID, "as /v1/models shows it in TEI, vLLM and infinity"
    assert public_name("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    assert public_name("/models/my-model/") == "my-model"
    assert public_name(str(tmp_path)) == tmp_path.name


def test_a_folder_that_exists_or_a_path_is_a_folder_and_anything_else_of_an_ids_form_is_a_hub_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_hub_id(MODEL_ID) and is_hub_id("bert-base-uncased")
    assert not any(map(is_hub_id, ("", "/models/x", "./x", "../x", "~/x", "a/b/c", "bad id!")))
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert not is_hub_id("org/name"), "a folder of that name here wins, as in transformers"


# ------------------------------------------------------------------------------------------- offline, from the cache


def test_a_hub_id_is_served_from_the_cache_offline_by_branch_tag_or_commit(cache: Path) -> None:
    snapshot = cache / ("models--" + MODEL_ID.replace("/", "--")) / "snapshots" / COMMIT
    for revision in ("", "main", TAG, COMMIT):
        fetched = fetch(MODEL_ID, revision, cache_dir=str(cache))
        assert (fetched.path, fetched.commit) == (str(snapshot), COMMIT), revision
    assert (snapshot / "config.json").is_file() and (snapshot / "1_Pooling" / "config.json").is_file()


def test_offline_an_id_not_in_the_cache_says_so_and_how_to_get_it(cache: Path) -> None:
    message = unavailable("org/absent", cache_dir=str(cache))
    assert message == (f"model 'org/absent' is not in the Hugging Face cache {cache}, and HF_HUB_OFFLINE=1 forbids "
                       f"downloading it: download it once with a connection (hf download org/absent), or unset "
                       f"HF_HUB_OFFLINE")


def test_offline_a_revision_not_in_the_cache_names_those_it_holds(cache: Path) -> None:
    message = unavailable(MODEL_ID, "v9", cache_dir=str(cache))
    assert message.startswith(f"model '{MODEL_ID}' at revision 'v9' is not in the Hugging Face cache {cache}; "
                              f"the cache holds main, {TAG}, {COMMIT}, and HF_HUB_OFFLINE=1 forbids"), message
    assert f"hf download {MODEL_ID} --revision v9" in message


# ------------------------------------------------------------------------------------------- folders


def test_a_folder_is_taken_as_it_is_and_a_missing_one_is_named(tmp_path: Path) -> None:
    assert fetch(str(tmp_path)).path == str(tmp_path.resolve()) and fetch(str(tmp_path)).commit == ""
    assert fetch("").path == bundled_model_path()
    assert unavailable(str(tmp_path / "absent")).startswith(f"model folder '{tmp_path / 'absent'}' does not exist: ")
    (tmp_path / "weights.bin").write_bytes(b"")
    assert "is a file: name the folder" in unavailable(str(tmp_path / "weights.bin"))
    assert unavailable(str(tmp_path), "v1").startswith("--revision 'v1' names a version of a Hub model, and ")


# ------------------------------------------------------------------------------------------- online: the fake Hub


def test_a_cold_cache_downloads_each_file_once_and_then_serves_from_the_cache(
        hub: FakeHub, online: None, tmp_path: Path) -> None:
    cache = str(tmp_path / "hub")
    sent = len(hub.files_sent)
    fetched = fetch(MODEL_ID, cache_dir=cache, endpoint=hub.url)
    assert fetched.commit == COMMIT
    wanted = sorted(map(str, files_of(Path(bundled_model_path()))))
    assert sorted(hub.files_sent[sent:]) == wanted
    assert sorted(map(str, files_of(Path(fetched.path)))) == wanted
    for revision in (TAG, COMMIT):
        assert fetch(MODEL_ID, revision, cache_dir=cache, endpoint=hub.url) == fetched
    assert len(hub.files_sent) == sent + len(wanted), "nothing downloaded twice"


def test_workers_that_start_together_download_the_model_once(hub: FakeHub, tmp_path: Path) -> None:
    """Two processes fetch into one cold cache at once, as the workers of a host started without zbatch serve:
    huggingface_hub's file locks let one download each file while the other waits for it."""
    code = "import sys; from zbatch.hub import fetch; print(fetch(sys.argv[1]).path)"
    env = daemon_env({"HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": hub.url})
    sent = len(hub.files_sent)
    processes = [subprocess.Popen([sys.executable, "-c", code, MODEL_ID], env=env, cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert len({out.strip() for out, _ in outputs}) == 1
    downloaded = hub.files_sent[sent:]
    assert sorted(downloaded) == sorted(set(downloaded)) and len(downloaded) == len(list(files_of(
        Path(bundled_model_path())))), downloaded


def test_the_hubs_refusals_each_get_their_line(hub: FakeHub, online: None, tmp_path: Path) -> None:
    where = {"cache_dir": str(tmp_path / "hub"), "endpoint": hub.url}
    assert unavailable("org/absent", **where) == (
        f"no model 'org/absent' on the Hub at {hub.url} (and no folder of that name here): check the id; a private "
        f"model needs a token with access (HF_TOKEN)")
    assert unavailable(MODEL_ID, "v9", **where) == (
        f"model '{MODEL_ID}' has no revision 'v9' on the Hub: name a branch, tag or commit it has "
        f"({hub.url}/{MODEL_ID}/tree/main lists them)")
    assert unavailable(GATED_ID, **where) == (  # the fake Hub answers its files 401 GatedRepo, as the Hub does
        f"model '{GATED_ID}' is gated on the Hub, and this host has no token with access to it: accept its conditions "
        f"at {hub.url}/{GATED_ID}, then give the workers a token (HF_TOKEN, or `hf auth login` as their user)")


def test_no_network_and_no_copy_in_the_cache_says_both(online: None, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    message = unavailable(MODEL_ID, cache_dir=str(cache), endpoint=CLOSED)
    assert message.startswith(f"cannot reach the Hugging Face Hub at {CLOSED} (ConnectionRefusedError: "), message
    assert message.endswith(f"and model '{MODEL_ID}' is not in the cache {cache}: check the network (or "
                            f"HF_ENDPOINT, a proxy), or copy the model into the cache"), message


def test_no_network_with_a_copy_in_the_cache_serves_the_copy(cache: Path, online: None) -> None:
    assert fetch(MODEL_ID, TAG, cache_dir=str(cache), endpoint=CLOSED).commit == COMMIT

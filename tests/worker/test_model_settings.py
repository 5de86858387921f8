"""Which models a worker serves, and the settings the engine takes, from its flags: typed once, at load."""

from __future__ import annotations

import pytest

from worker.config import load_config
from worker.cores import default_path
from worker.stages import TokenizeAhead


def test_main_model_only_by_default() -> None:
    (main,) = load_config([], {}).models
    assert (main.spec.name, main.spec.max_batch_size, main.spec.cuda_graphs) == ("all-MiniLM-L6-v2", 0, True)
    assert main.max_batch_delay_s == 0.005


def test_extra_models_inherit_unset_settings_from_the_main_one() -> None:
    config = load_config(["--max-batch-size", "16", "--cuda-graphs", "off", "--max-batch-delay-ms", "2",
                          "--extra-models", "name=cls,path=/m/cls,task=text-classification,max_batch_size=4,"
                          "cuda_graphs=auto,max_batch_delay_ms=0; path=/m/mlm,task=fill-mask"], {})
    main, cls, mlm = config.models
    assert [model.spec.name for model in config.models] == ["all-MiniLM-L6-v2", "cls", "mlm"]
    assert (cls.spec.task, cls.spec.max_batch_size, cls.spec.cuda_graphs, cls.max_batch_delay_s) == (
        "text-classification", 4, True, 0.0)
    assert (mlm.spec.path, mlm.spec.max_batch_size, mlm.spec.device, mlm.spec.cuda_graphs, mlm.max_batch_delay_s) == (
        "/m/mlm", 16, "auto", False, 0.002)
    assert (main.spec.cuda_graphs, main.max_batch_delay_s) == (False, 0.002)


def test_unpadded_attention_is_off_unless_asked_and_an_extra_model_may_set_its_own() -> None:
    (main,) = load_config([], {}).models
    assert main.spec.unpadded_attention is False
    main, inherits, own = load_config(["--extra-models", "name=a,path=/m/a;name=b,path=/m/b,unpadded_attention=off"],
                                      {"ZBATCH_UNPADDED_ATTENTION": "auto"}).models
    assert (main.spec.unpadded_attention, inherits.spec.unpadded_attention, own.spec.unpadded_attention) == (
        True, True, False)


def test_a_token_budget_is_none_unless_set_and_an_extra_model_may_set_its_own() -> None:
    (main,) = load_config([], {}).models
    assert main.spec.max_batch_tokens == 0
    main, inherits, own = load_config(["--max-batch-tokens", "16384", "--extra-models",
                                       "name=a,path=/m/a;name=b,path=/m/b,max_batch_tokens=0"], {}).models
    assert [model.spec.max_batch_tokens for model in (main, inherits, own)] == [16384, 16384, 0]
    with pytest.raises(SystemExit):  # more than READY can carry: refused at start, with the reason on stderr
        load_config(["--max-batch-tokens", "3000000000"], {})


def test_the_default_prompt_name_is_the_main_models_and_each_extra_models_own() -> None:
    config = load_config(["--extra-models", "name=a,path=/m/a;name=b,path=/m/b,default_prompt_name=passage"],
                         {"ZBATCH_DEFAULT_PROMPT_NAME": "query"})
    assert [model.spec.default_prompt_name for model in config.models] == ["query", "", "passage"]


@pytest.mark.parametrize(
    ("extra", "complaint"),
    [
        ("name=x", "needs a model= .a Hub id or a folder. or a path="),
        ("name=x,path=/p,colour=red", "expected key=value pairs"),
        ("name=all-MiniLM-L6-v2,path=/p", "served twice"),
        ("name=x,path=/p,max_batch_size=-1", "max_batch_size must be >= 0"),
        ("name=x,path=/p,max_batch_delay_ms=soon", "must be numbers"),
        ("name=x,path=/p,max_batch_tokens=-1", "max_batch_tokens 0 .no budget. to 2147483648"),
        ("name=x,path=/p,max_batch_tokens=3000000000", "max_batch_tokens 0 .no budget. to 2147483648"),
        ("name=x,path=/p,cuda_graphs=on", "cuda_graphs must be one of auto, off"),
        ("name=x,path=/p,unpadded_attention=yes", "unpadded_attention must be one of off, auto"),
    ],
)
def test_bad_extra_models_are_refused_with_a_reason(extra: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        load_config(["--extra-models", extra], {}).models  # noqa: B018  # reading them checks them


@pytest.mark.parametrize(("setting", "mode"), [("auto", TokenizeAhead.ON_ACCELERATORS),
                                                ("true", TokenizeAhead.ALWAYS), ("false", TokenizeAhead.NEVER)])
def test_tokenize_ahead_reaches_the_engine_as_a_mode(setting: str, mode: TokenizeAhead) -> None:
    assert load_config(["--tokenize-ahead", setting], {}).tokenize_ahead_mode is mode


def test_tokenize_ahead_modes_say_which_devices_they_prepare_for() -> None:
    assert [mode.applies("cpu") for mode in TokenizeAhead] == [True, False, False]
    assert [mode.applies("cuda:0") for mode in TokenizeAhead] == [True, True, False]


def test_the_cores_ledger_reaches_the_engine_as_a_file_or_none() -> None:
    assert load_config([], {}).cores_ledger_file == default_path()
    assert load_config(["--cores-ledger", "off"], {}).cores_ledger_file is None
    assert load_config(["--cores-ledger", "/tmp/ledger"], {}).cores_ledger_file == "/tmp/ledger"

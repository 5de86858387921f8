"""The worker's settings: one frozen object, built once at start by :func:`load_config`."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from worker.cores import default_path as default_ledger_path
from worker.model_settings import GRAPH_SETTINGS, UNPADDED_SETTINGS, ServedModel, budget_refusal, served_models
from worker.requests import InputLimits
from worker.runners.device import DTYPES
from worker.runners.spec import QUANTIZE, RUNTIMES
from worker.stages import TokenizeAhead
from zbatch.protocol.vocabulary import EMBEDDINGS
from zbatch.runtime import common_options
from zbatch.runtime.curve import check_client_settings, key_name
from zbatch.runtime.memory import FREED_MEMORY
from zbatch.runtime.settings import check_endpoints, check_exposure, load, option


def _check_device(value: str) -> str | None:
    kind, _, index = value.partition(":")
    if kind in ("auto", "cpu", "cuda") and (not index or (kind == "cuda" and index.isdigit())):
        return None
    return "must be auto, cpu, cuda or cuda:N"


@dataclass(frozen=True)
class WorkerConfig:
    """zbatch-worker: loads one model and serves it in deadline-bounded batches for the broker."""

    backend: str = option("tcp://127.0.0.1:5556", "the brokers' worker endpoints, comma-separated (several "
                          "brokers: the worker registers with each and splits its capacity)", check=check_endpoints)
    model: str = option("", "the model to serve: a Hugging Face Hub id (org/name), downloaded once into the Hugging "
                        "Face cache (HF_HUB_CACHE; HF_HUB_OFFLINE=1: from the cache only), or a folder (a path that "
                        "exists, or starts with /, . or ~); empty: the bundled all-MiniLM-L6-v2")
    revision: str = option("", "the Hub model's branch, tag or commit (empty: main); not for a folder")
    model_path: str = option("", "deprecated: a model folder, as --model takes it (one of the two, not both)")
    model_name: str = option("", "the name the model is served as (vLLM's --served-model-name; default: the Hub id, "
                             "the folder's name, or all-MiniLM-L6-v2)")
    trust_remote_code: bool = option(False, "run Python code the model brings with it (config.json auto_map), as "
                                     "transformers' trust_remote_code=True; off: such a model stops the worker at "
                                     "start, saying so")
    task: str = option(EMBEDDINGS, "'embeddings', 'sparse-embeddings' (a SPLADE masked-LM model), 'rerank', "
                       "'text-classification', 'image-classification', 'object-detection' or another transformers "
                       "pipeline task such as fill-mask")
    device: str = option("auto", "auto (CUDA when available), cpu, cuda or cuda:N", check=_check_device)
    dtype: str = option("auto", "weights dtype (auto: float32 on the CPU, float16 on CUDA, bfloat16 there for a "
                        "model saved in bfloat16); float16 needs CUDA; bfloat16 also suits CPUs with AVX512-BF16 or "
                        "AMX, where it runs faster than float32", choices=DTYPES)
    runtime: str = option("auto", "what runs text models (embeddings, rerank, text-classification): auto: ONNX "
                          "Runtime on the CPU where the model's export validates against torch, torch elsewhere "
                          "(GPUs, other tasks, dtypes other than float32); torch; onnx: ONNX Runtime or no start",
                          choices=RUNTIMES)
    quantize: str = option("none", "int8: ONNX Runtime's dynamic int8 quantization of the weights, kept only where "
                           "its outputs stay at cosine >= 0.98 to torch's (close to float32, not equal)",
                           choices=QUANTIZE)
    onnx_cache: str = option("", "folder of what a start works out and the next start of the same model here "
                             "reads: the exported ONNX graphs, their validation verdicts and the calibrations, "
                             "shared by the workers that start together; delete it, or any of it, at any time "
                             "(default: $XDG_CACHE_HOME/zbatch/onnx, or ~/.cache/zbatch/onnx)")
    max_batch_size: int = option(0, "most items in one batch (0: 32 on the CPU, 128 on CUDA)", minimum=0)
    max_batch_tokens: int = option(0, "most tokens one forward pass of a text model runs, padding included: a "
                                   "batch over it runs as several passes, and one input longer runs alone, so "
                                   "long inputs cannot take more memory than this allows (TEI's setting of the "
                                   "name; 0: no budget)", minimum=0, check=budget_refusal)
    cuda_graphs: str = option("auto", "on CUDA, run each padded batch shape of a BERT embedding model as one CUDA "
                              "graph captured before READY, one launch a batch instead of one a kernel (auto), or "
                              "eagerly (off)", choices=GRAPH_SETTINGS)
    unpadded_attention: str = option("off", "on an accelerator, run a BERT embedding model's batch packed, with no "
                                     "padding and one variable-length attention call, where warm-up's timings say "
                                     "that beats its padded (graphed) pass (auto), or always padded (off; on the "
                                     "CPU batches pack either way)", choices=UNPADDED_SETTINGS)
    max_batch_delay_ms: float = option(
        5.0, "longest wait for more items once a batch could start; 0 never waits", minimum=0)
    default_prompt_name: str = option(
        "", "the prompt of the model's config_sentence_transformers.json put before a text whose request names "
        "none (embeddings and sparse-embeddings models); empty: the model's own default_prompt_name, if any")
    extra_models: str = option(
        "", "more models on this worker: 'name=N,path=P[,task=..,device=..,dtype=..,runtime=..,quantize=..,"
        "max_batch_size=..,max_batch_tokens=..,max_batch_delay_ms=..,cuda_graphs=..,unpadded_attention=..,"
        "default_prompt_name=..]' "
        "separated by ';' (unset keys: the main model's, but default_prompt_name)")
    capacity: int = option(0, "items accepted in flight (0: two of the main model's batches)", minimum=0)
    max_inputs: int = option(256, "most inputs in one request, from any caller (bad_request beyond)", minimum=1)
    max_input_chars: int = option(100_000, "most characters in one input, from any caller (bad_request beyond)",
                                  minimum=1)
    max_body_bytes: int = option(1024 * 1024, "largest request payload, from any caller (bad_request beyond); "
                                 "the gateway's body limit, for ZeroMQ callers", minimum=1024)
    torch_threads: int = option(0, "most torch threads a batch runs on (0: every core the cores ledger grants; "
                                "with --cores-ledger off, this host's cores divided by --workers)", minimum=0)
    workers: int = option(1, "worker processes sharing this host's cores, for the fixed split of "
                          "--cores-ledger off", minimum=1)
    cores_ledger: str = option("auto", "CPU workers that name the same file share this host's cores by how "
                               "many of them are busy: a lone busy worker runs torch on all of them, busy ones "
                               "split them and never run more threads together than the cores; 'auto': this "
                               "user's file in /dev/shm; 'off': a fixed thread count (--torch-threads)",
                               check=lambda value: None if value.strip() else "must be auto, off or a file")
    freed_memory: str = option("keep", "keep: memory a batch frees stays in the worker for the next batch "
                               "(glibc: one arena, no mmap'd blocks, no trimming), so activations do not fault "
                               "back in page by page; resident memory stays at the largest batch's peak; return: as "
                               "the broker and gateway, blocks over 256 KiB go back to the system when freed. "
                               "MALLOC_* or GLIBC_TUNABLES malloc settings in the environment win",
                               choices=FREED_MEMORY)
    tokenize_ahead: str = option("auto", "a second thread tokenizes waiting requests and prepares the next text "
                                 "batch while the model runs; auto: for models on an accelerator, whose runs "
                                 "leave the CPU free (on the CPU, torch already holds every core); false: the "
                                 "inference thread does it before each batch",
                                 choices=tuple(mode.value for mode in TokenizeAhead))
    name: str = option("", "worker identity shown by the broker, and its routing id (default: host-pid; "
                       "with CURVE, the name of its key, which it must be)")
    heartbeat_ms: int = option(1_000, "heartbeat interval; must match the broker's", minimum=10)
    heartbeat_liveness: int = option(3, "missed intervals before the broker is considered gone", minimum=1)
    drain_timeout_ms: int = option(10_000, "on SIGTERM, how long held work may take to finish", minimum=0)
    batch_timeout_ms: int = option(60_000, "a batch running longer means the model is stuck: exit", minimum=100)
    log_level: str = common_options.log_level()
    log_format: str = common_options.log_format()
    metrics_port: int = common_options.metrics_port()
    metrics_host: str = common_options.metrics_host()
    curve_server_key_file: str = common_options.curve_server_key_file()
    curve_secret_key_file: str = common_options.client_secret_key_file("this worker's")
    insecure: bool = common_options.insecure()

    def __post_init__(self) -> None:
        problem = check_client_settings(self.curve_server_key_file, self.curve_secret_key_file)
        problem = problem or check_exposure({"backend": self.backend}, curve=bool(self.curve_server_key_file),
                                            insecure=self.insecure)
        problem = problem or self._check_name_is_key_name()
        if not problem and self.model and self.model_path:
            problem = (f"model ({self.model!r}) and model_path ({self.model_path!r}) both name the model: set model "
                       f"alone (model_path is its deprecated folder form)")
        if problem:
            raise ValueError(problem)

    def _check_name_is_key_name(self) -> str | None:
        """With CURVE the broker knows a worker by its key's name: a different --name would be refused there."""
        key = key_name(self.curve_secret_key_file) if self.curve_secret_key_file else ""
        if key and self.name and self.name != key:
            return (f"name {self.name!r} is not the name of this worker's CURVE key {key!r} "
                    f"({self.curve_secret_key_file}): with CURVE a worker's name is its key's, so leave name "
                    f"out or make a key pair named {self.name!r} with zbatch-keys")
        return None

    @property
    def input_limits(self) -> InputLimits:
        """The limits every request's payload is held to (the gateway holds HTTP callers to the same)."""
        return InputLimits(self.max_inputs, self.max_input_chars, self.max_body_bytes)

    @property
    def identity(self) -> str:
        """The worker's name and routing id: ``name``, its CURVE key's name, or host-pid."""
        if self.name:
            return self.name
        if self.curve_secret_key_file:
            return key_name(self.curve_secret_key_file)
        return f"{socket.gethostname()}-{os.getpid()}"

    @cached_property
    def models(self) -> tuple[ServedModel, ...]:
        """The models to serve, main first, typed and checked (ValueError: which setting is wrong, and why)."""
        return served_models(self)

    @property
    def tokenize_ahead_mode(self) -> TokenizeAhead:
        """``tokenize_ahead`` as the engine takes it."""
        return TokenizeAhead(self.tokenize_ahead)

    @property
    def cores_ledger_file(self) -> str | None:
        """The cores ledger's file (``auto``: this user's in /dev/shm); None: ``off``, a fixed thread count."""
        if self.cores_ledger == "off":
            return None
        return default_ledger_path() if self.cores_ledger == "auto" else self.cores_ledger

    def effective_capacity(self, batch_size: int) -> int:
        """Items accepted in flight, once the main model's batch size on its device is known."""
        return self.capacity or 2 * batch_size


def load_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> WorkerConfig:
    return load(WorkerConfig, argv, environ, prog="zbatch-worker", section="worker")

"""What the runners that tokenize text themselves share: a batch encoded, planned in groups, and run.

Theory of operation
-------------------
:class:`TextRunner` runs a batch of texts (or ``[text, text_pair]`` pairs)
through a tokenizer and a model, one forward pass per length group, in three
steps that the worker can run on different threads (:mod:`worker.engine`):

1. :meth:`~TextRunner.encode`: inputs and parameters are checked (a bad
   parameter refuses the batch), and the inputs are tokenized once, without
   padding, truncated on ``truncation_direction``.  With ``truncate`` false
   they are taken untruncated, and each input longer than the model takes is
   refused alone: its result is an :class:`InputError` saying its length and
   the maximum, and the others run.  Where the runner's ``kind`` takes them
   (embeddings, sparse embeddings), an input may be token ids instead of a
   text: they are its encoding as they are, checked and truncated as
   :mod:`worker.runners.token_ids` says, and texts and ids mix in a batch.  Only the tokenizer runs, never torch;
   each thread tokenizes with a copy of its own, so any thread may encode.  Inputs encode the same
   alone as in a batch, so the worker encodes each request as it arrives and
   a batch gathers its requests' encodings.
2. :meth:`~TextRunner.plan`: :mod:`worker.runners.grouping` plans the length
   groups from the encodings' lengths, and each group is padded into arrays
   (numpy, no torch).  A runner with a packer (:mod:`worker.runners.packing`:
   a BERT encoder on a CPU, or on an accelerator where
   :mod:`worker.runners.unpadded` finds it wins) plans packed groups instead,
   their inputs concatenated with no padding at all.  On an accelerator a
   padded batch is one group in its bucket (:mod:`worker.runners.shapes`).
   A token budget (``--max-batch-tokens``) cuts every kind of group into
   passes within it (:func:`~worker.runners.grouping.within_budget`).
   Each encoding's length is the input's tokens as run,
   after truncation with special tokens, so counting costs nothing: results
   are :class:`~worker.runners.spec.Outputs` carrying those counts.
3. :meth:`~TextRunner.run_planned`: each group's arrays become tensors on
   the model's device and run; only this step calls torch.

:meth:`~TextRunner.run` does the three in a row.

Truncation, encodings and their padding live in :mod:`worker.runners.encoding`,
which the pipeline runner shares.  torch is imported inside the functions, so
importing this module stays cheap.
"""

from __future__ import annotations

import copy
import logging
import operator
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from worker.runners import calibrations
from worker.runners.encoding import (
    TRUNCATION_PARAMETERS,
    Encoding,
    Truncation,
    check_parameters,
    concatenated,
    pad_rows,
    tokenize_texts,
    truncation_of,
    truncation_side,
)
from worker.runners.grouping import NEVER_SPLIT, CostModel, calibrate, plan_groups, within_budget
from worker.runners.operations import decode_ids
from worker.runners.packing import Packer, packed_groups
from worker.runners.phases import phase
from worker.runners.prompts import Prompts, prompted
from worker.runners.shapes import Buckets
from worker.runners.spec import (
    InputError,
    InputKind,
    ModelDetails,
    ModelSpec,
    Outputs,
    check_inputs,
)
from worker.runners.token_ids import SpecialFrame, edge_form, outside_vocabulary
from worker.runners.unpadded import PassTimings, packing_pays, timed_passes
from zbatch.protocol.payloads import tokenizer_fingerprint
from zbatch.protocol.texts import TextEncoder
from zbatch.protocol.vocabulary import (
    PROMPT_NAME,
    TOKENIZE,
    TOKENIZED_BY,
    TOKENIZER,
    TRUNCATE,
)
from zbatch.protocol.wire import shortened

log = logging.getLogger("zbatch.worker")


@dataclass(frozen=True, slots=True)
class Planned:
    """A batch ready for the model: its length groups padded into arrays (or one group packed), refused
    inputs' errors in place."""

    groups: list[tuple[list[int], dict[str, np.ndarray]]]  # (indices into the batch, the group's arrays)
    outputs: list[Any]  # an InputError where an input was refused, None where the model will answer
    tokens: list[int]
    options: Any
    modelled_seconds: float  # the groups' modelled time on the full thread count (0: not known)
    packed: bool = False  # each group's rows concatenated into 1-D arrays (no attention mask)


def dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


class TextRunner:
    """A tokenizer and a model, run over length-sorted groups; subclasses say what a forward pass returns.

    A subclass sets ``kind`` and ``parameters`` (what its task accepts
    besides truncation), builds ``details`` and implements
    :meth:`_options` (its parameters, checked) and :meth:`_forward`.
    """

    kind = InputKind.TEXT
    parameters: frozenset[str] = frozenset()
    warm_up_input: Any = "warm-up"
    takes_prompts = False  # a prompt of the model's may go before each text (worker.runners.prompts)

    def __init__(self, spec: ModelSpec, device: str, tokenizer: Any, model: Any, max_length: int) -> None:
        self.spec = spec
        self.device = device
        self.max_length = max_length
        self.cost_model = CostModel(0.0)
        self.modelled_seconds = 0.0  # what the last batch took at calibration (0: not known)
        self.details = ModelDetails(max_length, dtype=dtype_name(model.dtype),
                                    max_batch_tokens=spec.max_batch_tokens or None)
        self._tokenizer = tokenizer  # its settings (padding side, pad tokens) are read by every thread
        self._vocabulary = len(tokenizer)
        self._special_frame = SpecialFrame.of(tokenizer)  # what truncated token ids keep at their ends
        self._takes_token_types = "token_type_ids" in tokenizer.model_input_names
        self._own_tokenizers = threading.local()
        self._model = model
        self.prompts = prompts_of(spec, self.takes_prompts)
        self._edge_form = edge_form(tokenizer, self.kind is InputKind.TEXT_OR_IDS, self.prompts.prefix({}))
        fingerprint = tokenizer_fingerprint(self._edge_form) if self._edge_form else ""
        self.details = replace(self.details, tokenizer=fingerprint)
        self._length_grouping = True
        self._timed_modes: dict[bool, CostModel] = {}  # a packing runner's timing of each mode it has run in
        self._packer: Packer | None = None  # set by a subclass that can run packed groups, or by the runtime
        self._pass_timings: PassTimings | None = None  # on an accelerator that may pack: runners.unpadded
        # On an accelerator, batches are padded to a few shapes, each warmed up before READY (worker.runners.shapes).
        self.buckets = None if device == "cpu" else Buckets(max_length, spec.max_batch_size or 1,
                                                            spec.max_batch_tokens)

    def set_length_grouping(self, enabled: bool) -> None:
        """Trim padding (the default: length groups, or packed passes), or run every batch padded (one pass
        within the token budget, where one is set).

        Off, the model runs as plain serving code runs it, which is what a
        comparison with such code needs.  The outputs agree either way, to
        float rounding.  A runner that packs times its passes again (call it
        on the thread that runs the model), as packed and padded passes cost
        differently; a mode it has been timed in before takes that timing back.
        """
        if enabled == self._length_grouping:
            return
        timed = self._packer is not None and self.cost_model.seconds_per_token
        if timed:
            self._timed_modes[self._length_grouping] = self.cost_model
        self._length_grouping = enabled  # before timing: the pass timed is the new mode's
        if timed:
            self.cost_model = self._timed_modes.get(enabled) or calibrate(self._seconds_for)

    def warm_up(self) -> None:
        """Run a tiny batch (lazy initialisation), then measure what padding costs on this device (or read it
        from the start cache: :mod:`worker.runners.calibrations`); on an accelerator, run every bucket's shape
        that serving runs eagerly once first, so that serving never meets a new one."""
        self.run([self.warm_up_input], {})
        self._warm_shapes(self._eager_shapes())
        with phase("calibration"):
            self.cost_model = calibrations.calibrated(calibrations.key_of(self), self._seconds_for)

    def _eager_shapes(self) -> list[tuple[int, int]]:
        """The bucket shapes serving runs through the model's own forward pass (on a CPU, none: no buckets)."""
        return self.buckets.shapes() if self.buckets is not None else []

    def _warm_shapes(self, shapes: list[tuple[int, int]]) -> None:
        """Run each ``(rows, length)`` once, the way serving runs it."""
        if not shapes or self.buckets is None:
            return
        started = time.perf_counter()
        with phase("shapes"):
            for rows, length in shapes:
                self._warm(rows, length)
        log.info("model %s: %d shapes (up to %d rows of %d tokens) warmed up on %s in %.1f s", self.spec.name,
                 len(shapes), self.buckets.max_rows, self.buckets.max_length, self.device,
                 time.perf_counter() - started)

    def tokenize(self, inputs: list[Any], parameters: dict[str, Any]) -> Outputs:
        """Each text's tokens (``tokenize``), its prompt's included where the runner takes prompts."""
        self.modelled_seconds = 0.0
        if not self.takes_prompts:
            return tokenize_texts(self._own_tokenizer(), inputs, parameters)
        check_inputs(inputs, InputKind.TEXT, repr(TOKENIZE))
        rest = {name: value for name, value in parameters.items() if name != PROMPT_NAME}
        return tokenize_texts(self._own_tokenizer(), prompted(self.prompts.prefix(parameters), inputs), rest)

    def decode(self, inputs: list[Any], parameters: dict[str, Any]) -> Outputs:
        """Each input's token ids as text (``decode``, worker.runners.operations)."""
        self.modelled_seconds = 0.0
        return decode_ids(self._own_tokenizer(), inputs, parameters)

    def run(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Any]:
        """One output per input, in input order, with the tokens each took (refused inputs: an InputError)."""
        self.modelled_seconds = 0.0  # stays 0 if this batch is refused before it runs
        return self.run_planned(self.plan(self.encode(inputs, parameters), parameters))

    def encode(self, inputs: list[Any], parameters: dict[str, Any]) -> list[Encoding | InputError]:
        """Each input tokenized for the model, or the InputError that refuses it alone; InputError for a bad
        batch.  The tokenizer only, never torch: any thread may call it."""
        check_inputs(inputs, self.kind, self.spec.task)
        check_parameters(self._callers(parameters), self.parameters | TRUNCATION_PARAMETERS | self._prompt_parameters,
                         self.spec.task)
        truncation = truncation_of(parameters)
        self._options(parameters)
        prefix = self.prompts.prefix(parameters) if self.takes_prompts else ""
        texts = [item for item in inputs if not isinstance(item, np.ndarray)]  # token ids are encoded already
        encoded = iter(self._tokenized(_texts(prompted(prefix, texts)), truncation) if texts else [])
        return [self._within_length(self._from_ids(item, truncation, prefix) if isinstance(item, np.ndarray)
                                    else next(encoded)) for item in inputs]

    def _within_length(self, encoding: Encoding | InputError) -> Encoding | InputError:
        """``encoding``, or the InputError that refuses it for being longer than the model takes (untruncated)."""
        if isinstance(encoding, Encoding) and encoding.length > self.max_length:
            return InputError(
                f"this input has {encoding.length} tokens and the model takes at most {self.max_length}: "
                f"shorten it, or let the model truncate it (parameter {TRUNCATE!r}: true)")
        return encoding

    def _from_ids(self, ids: np.ndarray, truncation: Truncation, prefix: str) -> Encoding | InputError:
        """Token ids as the encoding the model runs (module :mod:`worker.runners.token_ids`), truncated as asked;
        or the InputError that refuses them alone: none, an id outside the vocabulary, or a prompt to put
        before them."""
        if prefix:
            return InputError(f"a prompt cannot go before token ids ({PROMPT_NAME!r}, or the model's default "
                              "prompt, applies to this request): send the text instead, or the ids of prompt and "
                              f"text together ({TOKENIZE!r} with the {PROMPT_NAME!r} gives them) to a model "
                              "without a default prompt")
        if not ids.size:
            return InputError(f"this input is an empty array of token ids: send at least one (what {TOKENIZE!r} "
                              "gives a text, its special tokens included)")
        refusal = outside_vocabulary(ids, self._vocabulary)
        if refusal:
            return InputError(refusal)
        if truncation.enabled:
            ids = self._special_frame.truncated(ids, self.max_length, truncation.direction == "right")
        rows = {"input_ids": ids.astype(np.int64)}
        if self._takes_token_types:
            rows["token_type_ids"] = np.zeros(ids.size, dtype=np.int64)
        return Encoding(rows)

    def _tokenized(self, texts: list[Any], truncation: Truncation) -> list[Encoding]:
        """Each text (or pair) as the tokenizer encodes it without padding, truncated as asked.

        A fast tokenizer is called directly (what transformers calls under its own Python, which costs more
        than the encoding of a short text and holds the GIL meanwhile), with the settings transformers gives
        it for ``tokenizer(texts, truncation=True, max_length=...)``; any other through transformers.
        """
        tokenizer = self._own_tokenizer()
        backend = tokenizer.backend_tokenizer if tokenizer.is_fast else None
        if backend is None:
            limit = {"truncation": True, "max_length": self.max_length} if truncation.enabled else {}
            with truncation_side(tokenizer, truncation.direction):
                encoded = tokenizer(texts, **limit)
            keys = [key for key in encoded if key != "attention_mask"]
            return [Encoding({key: np.asarray(encoded[key][index], dtype=np.int64) for key in keys})
                    for index in range(len(texts))]
        encoder = self._own_encoder(backend)
        encoder.limit(self.max_length if truncation.enabled else None, truncation.direction)
        types = self._takes_token_types
        return [Encoding({"input_ids": np.asarray(each.ids, dtype=np.int64),
                          **({"token_type_ids": np.asarray(each.type_ids, dtype=np.int64)} if types else {})})
                for each in encoder(texts)]

    def plan(self, encodings: Sequence[Encoding | InputError], parameters: dict[str, Any]) -> Planned:
        """The length groups of a batch of encodings, padded; numpy only, never torch."""
        options = self._options(parameters)
        outputs: list[Any] = [each if isinstance(each, InputError) else None for each in encodings]
        tokens = [0 if isinstance(each, InputError) else each.length for each in encodings]
        runnable = [index for index, each in enumerate(encodings) if not isinstance(each, InputError)]
        if (self._packer is not None and self._length_grouping and len(runnable) >= max(1, self._packer.min_inputs)
                and self._packs(runnable, tokens)):
            groups = packed_groups(runnable, tokens, self._packed_cap)
            modelled = (sum(self.cost_model.packed_seconds([tokens[i] for i in group]) for group in groups)
                        if len(runnable) > 1 else 0.0)
            packed = [(group, concatenated([encodings[i] for i in group])) for group in groups]  # type: ignore[misc]
            return Planned(packed, outputs, tokens, options, modelled, packed=True)
        if self.buckets is not None:  # padding costs little here, a new shape much: one group, in its bucket
            groups = within_budget([runnable] if runnable else [], tokens, self.spec.max_batch_tokens,
                                   self.buckets.padded_tokens)
            modelled = 0.0
        else:
            groups, modelled = self._groups(runnable, tokens)
        padded = [(group, self._pad([encodings[i] for i in group])) for group in groups]  # type: ignore[misc]
        return Planned(padded, outputs, tokens, options, modelled)

    @property
    def _packed_cap(self) -> int | None:
        """The most tokens of one packed pass: the packer's own cap or the token budget, the smaller."""
        assert self._packer is not None
        return _tighter(self._packer.max_tokens, self.spec.max_batch_tokens)

    def _packs(self, runnable: list[int], tokens: list[int]) -> bool:
        """Whether a batch's ``runnable`` inputs (of ``tokens`` each) run packed: on a CPU always (packing only
        drops padding there); on an accelerator where warm-up's timings say it wins
        (:mod:`worker.runners.unpadded`)."""
        return self.buckets is None or packing_pays([tokens[i] for i in runnable], self.buckets,
                                                    self._pass_timings, self.spec.max_batch_tokens, self._packed_cap)

    def time_passes(self) -> None:
        """On an accelerator where batches may pack: time every bucket padded and packed, as serving runs each
        (after the graphs' capture), for :meth:`_packs` to choose by (:mod:`worker.runners.unpadded`)."""
        if self.buckets is None or self._packer is None:
            return
        with phase("pass timings"):
            self._pass_timings = timed_passes(self.buckets.shapes(), self._filler_plan, self._timed)
        if self._pass_timings is None:
            log.info("model %s: packed passes did not time slower for more tokens here, so every batch runs "
                     "padded", self.spec.name)
            return
        timings = self._pass_timings
        wins = sum(packing_pays([length] * rows, self.buckets, timings, self.spec.max_batch_tokens,
                                self._packed_cap) for rows, length in timings.padded)
        log.info("model %s: %d buckets timed padded and packed (packed: %.2f ms + %.3f us a token); each batch "
                 "runs the cheaper way (packed for %d of the buckets full)", self.spec.name, len(timings.padded),
                 1e3 * timings.packed_fixed_s, 1e6 * timings.packed_per_token_s, wins)

    def _timed(self, planned: Planned) -> float:
        started = time.perf_counter()
        self.run_planned(planned)  # its outputs are on the host: the device has finished
        return time.perf_counter() - started

    def run_planned(self, planned: Planned) -> Outputs:
        """Run a planned batch's groups through the model: the only step that calls torch."""
        import torch

        self.modelled_seconds = planned.modelled_seconds
        outputs = list(planned.outputs)
        for group, arrays in planned.groups:
            encoded = {key: torch.from_numpy(array) if key == "lengths" else _to_device(torch.from_numpy(array),
                                                                                           self.device)
                       for key, array in arrays.items()}  # lengths stay on the host: read there, no device wait
            forward = self._forward_packed if planned.packed else self._forward
            for index, output in zip(group, forward(encoded, planned.options)[:len(group)], strict=True):
                outputs[index] = output  # a bucket's filler rows come last: their outputs are dropped
        return Outputs(outputs, list(planned.tokens))

    def serialized_tokenizer(self, inputs: list[Any], parameters: dict[str, Any]) -> Outputs:
        """The ``tokenizer`` operation: for each input, a fingerprint, the tokenizer it names serialized
        (:func:`~worker.runners.token_ids.edge_form`), for a gateway that tokenizes for this model."""
        self.modelled_seconds = 0.0
        check_parameters(parameters, frozenset(), repr(TOKENIZER))
        own = self.details.tokenizer
        if not own:
            raise InputError(f"model {self.spec.name!r} announces no tokenizer to tokenize with elsewhere (it takes "
                             "no token ids, has no fast tokenizer, or has a default prompt): send it texts")
        return Outputs([self._edge_form if item == own else
                        InputError(f"this worker's tokenizer is {own}, not {shortened(repr(item))}")
                        for item in inputs], [0] * len(inputs))

    def _callers(self, parameters: dict[str, Any]) -> dict[str, Any]:
        """The parameters a caller chose, without the ``tokenized_by`` a gateway adds where this worker announces a
        tokenizer (so a refusal lists only what a caller may send); InputError for ids made with another tokenizer
        (a model changed under its name).  A worker that announces none keeps it, to refuse as unknown."""
        sender = parameters.get(TOKENIZED_BY)
        if not self._edge_form or sender is None:
            return parameters
        if sender != self.details.tokenizer:
            raise InputError(f"these inputs were tokenized with tokenizer {shortened(repr(sender))} and this "
                             f"worker's model {self.spec.name!r} uses {self.details.tokenizer}: send the texts, or "
                             "retry once the sender has its new tokenizer")
        return {name: value for name, value in parameters.items() if name != TOKENIZED_BY}

    @property
    def _prompt_parameters(self) -> frozenset[str]:
        return frozenset({PROMPT_NAME}) if self.takes_prompts else frozenset()

    def _own_tokenizer(self) -> Any:
        """This thread's copy of the tokenizer.  A call sets the tokenizer's truncation (shared state), so
        threads never share one; each encodes on its own, in parallel (fast tokenizers release the GIL)."""
        own = getattr(self._own_tokenizers, "tokenizer", None)
        if own is None:
            own = self._own_tokenizers.tokenizer = copy.deepcopy(self._tokenizer)
        return own

    def _own_encoder(self, backend: Any) -> TextEncoder:
        """This thread's encoder of ``backend``, the fast tokenizer under its copy of the tokenizer."""
        own = getattr(self._own_tokenizers, "encoder", None)
        if own is None or own.tokenizer is not backend:
            own = self._own_tokenizers.encoder = TextEncoder(backend)
        return own

    def _options(self, parameters: dict[str, Any]) -> Any:
        """The task's own parameters, checked (InputError), in whatever form :meth:`_forward` takes."""
        return None

    def _forward(self, encoded: Any, options: Any) -> list[Any]:
        """One output per row of a padded, tokenized group."""
        raise NotImplementedError

    def _forward_packed(self, encoded: Any, options: Any) -> list[Any]:
        """One output per input of a packed group (:func:`~worker.runners.encoding.concatenated`); for a subclass
        that sets a packer."""
        raise NotImplementedError

    def _groups(self, runnable: list[int], lengths: Sequence[int]) -> tuple[list[list[int]], float]:
        """``runnable`` (indices of the batch) in the length groups that cost least to run, and their modelled
        time (0 for one input: no plan to make)."""
        if len(runnable) < 2:
            return ([runnable] if runnable else []), 0.0
        chosen = [lengths[i] for i in runnable]
        plan = within_budget(plan_groups(chosen, self.cost_model if self._length_grouping else NEVER_SPLIT), chosen,
                             self.spec.max_batch_tokens, operator.mul)
        return [[runnable[i] for i in group] for group in plan], self.cost_model.seconds(plan, chosen)

    def _pad(self, encodings: list[Encoding]) -> dict[str, np.ndarray]:
        """One group's rows padded to its longest (on an accelerator: to its bucket, filler rows added), on the
        tokenizer's padding side, with its attention mask."""
        longest = max(each.length for each in encodings)
        rows = len(encodings)
        if self.buckets is not None:
            longest, rows = self.buckets.length(longest), self.buckets.rows(rows)
        tokenizer = self._tokenizer
        pads = {"input_ids": tokenizer.pad_token_id, "token_type_ids": tokenizer.pad_token_type_id}
        if pads["input_ids"] is None and any(each.length < longest for each in encodings):
            raise ValueError("this model's tokenizer has no padding token, so inputs of different lengths "
                             "cannot share a batch")
        filler = Encoding({key: values[:1] for key, values in encodings[0].rows.items()})  # one real token
        return pad_rows([*encodings, *[filler] * (rows - len(encodings))], longest,
                        {key: pads.get(key) or 0 for key in encodings[0].rows}, tokenizer.padding_side == "left")

    def _warm(self, rows: int, length: int) -> None:
        """Run one batch of ``rows`` inputs padded to ``length`` the way serving runs it, and wait for it."""
        self.run_planned(self._filler_plan(rows, length, packed=False))

    def _filler_plan(self, rows: int, length: int, packed: bool) -> Planned:
        """A batch of ``rows`` inputs of exactly ``length`` tokens (the warm-up text's, repeated), padded or
        packed, for warming and timing."""
        (sample,) = self.encode([self.warm_up_input], {})
        assert isinstance(sample, Encoding)
        encodings = [Encoding({key: np.resize(values, length) for key, values in sample.rows.items()})] * rows
        arrays = (concatenated(encodings) if packed
                  else pad_rows(encodings, length, dict.fromkeys(sample.rows, 0), False))
        return Planned([(list(range(rows)), arrays)], [None] * rows, [length] * rows, self._options({}), 0.0,
                       packed=packed)

    def _seconds_for(self, rows: int, tokens: int) -> float:
        """Time one forward pass over ``rows`` inputs of exactly ``tokens`` tokens (for calibration)."""
        import torch

        shape = (rows, min(tokens, self.max_length))
        word_id = self._tokenizer.convert_tokens_to_ids(self._tokenizer.unk_token or "a")
        assert isinstance(word_id, int)  # one token in, one id out
        batch = {"input_ids": torch.full(shape, word_id, device=self.device),
                 "attention_mask": torch.ones(shape, dtype=torch.long, device=self.device)}
        started = time.perf_counter()
        with torch.inference_mode():
            if self._packer is not None and self._length_grouping:  # time the pass the batches will run
                self._packer(batch["input_ids"].flatten(), None, [shape[1]] * shape[0]).sum().item()
            else:
                self._model(**batch)[0].float().sum().item()  # .item() waits for a GPU to finish
        return time.perf_counter() - started


def load_model(auto_class: str, spec: ModelSpec, device: str, dtype: Any) -> Any:
    """The transformers model by ``auto_class`` (``AutoModel``, ...) on ``device`` in ``dtype``, in eval mode; its
    modeling code's import included, which costs more than a small model's weights."""
    with phase("model"):
        import transformers

        model = getattr(transformers, auto_class).from_pretrained(spec.path, **spec.pretrained)
        return model.to(device=device, dtype=dtype).eval()


def prompts_of(spec: ModelSpec, takes_prompts: bool) -> Prompts:
    """The model's prompts, for a runner that takes them; a default prompt for one that does not is an error."""
    if takes_prompts:
        return Prompts.load(spec.path, spec.default_prompt_name)
    if spec.default_prompt_name:
        raise ValueError(f"model {spec.name!r}: a default prompt name is for embeddings models, not {spec.task}")
    return Prompts()


def _to_device(tensor: Any, device: str) -> Any:
    """``tensor`` on ``device``; to an accelerator from pinned memory, without waiting for the copy (the model's
    kernels queue behind it on the same stream)."""
    if device == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def _tighter(cap: int | None, budget: int) -> int | None:
    """The smaller of a packer's own cap (None: none) and the token budget (0: none)."""
    if not budget:
        return cap
    return budget if cap is None else min(cap, budget)


def _texts(inputs: list[Any]) -> list[Any]:
    """Texts as they are, pairs as the tuples a tokenizer reads as (text, text_pair)."""
    return [tuple(item) if isinstance(item, list) else item for item in inputs]

"""Goose inside Hugging Face's own ``model.generate``: ``custom_generate=goose.hf.generate``.

transformers 5 prepares the inputs, the generation config, the logits processors and the
stopping criteria, then hands the decoding loop to a callable ``custom_generate``. This module is
that loop: it runs the Goose cycle and returns what ``generate`` returns (the ids tensor, or a
``GenerateDecoderOnlyOutput`` with ``return_dict_in_generate=True``)::

    import goose.hf
    inputs = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**inputs, custom_generate=goose.hf.generate, max_new_tokens=128)

Stopping criteria (``max_new_tokens``, ``eos_token_id``, ``max_time``, ``StopStringCriteria``, your
own) are applied one token at a time inside each Goose cycle, so generation stops at exactly the
token where plain ``generate`` stops; in float32 greedy output is token-identical to it. Goose
options go through one keyword, ``goose_config=`` (a :class:`GooseConfig` or a dict of its fields);
``prediction=`` (text, token ids or a 1-D tensor of them) is OpenAI's Predicted Outputs: the expected
output, which Goose drafts from first; the output is the same with it or without it.

transformers (5.16 to 5.24 at least) hands a ``custom_generate`` callable neither the ``streamer``
nor the ``tokenizer`` passed to ``generate`` (``_extract_generation_mode_kwargs`` replaces them by
the callable's own keywords), so ``streamer=`` and ``stop_strings=`` with ``tokenizer=`` cannot
reach the callable. Two ways around it, both through transformers' public doors:

- the folder door, ``custom_generate=goose.hf.FOLDER, trust_remote_code=True``: transformers gives
  a ``custom_generate`` *folder* every argument of ``generate``, so there ``streamer=``,
  ``stop_strings=`` and ``tokenizer=`` work as they do in plain ``generate``;
- with the callable, a streamer goes in as ``goose_streamer=``, a tokenizer as ``goose_tokenizer=``
  and stop strings as ``stopping_criteria=[StopStringCriteria(tokenizer, [...])]``.

Should a later transformers pass ``streamer``/``tokenizer`` to the callable, they are honoured too.

Whatever Goose cannot honour (a batch, beams, several return sequences, assisted decoding, a
logits processor that is not a pure temperature/top-k/top-p warper, padding, per-step scores or
attentions) is a ``ValueError`` that names the option, never a silent fallback.
"""

from __future__ import annotations

import copy
import logging
import threading
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError
from transformers import AutoTokenizer, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import (
    GenerateDecoderOnlyOutput,
    LogitNormalization,
    LogitsProcessorList,
    StoppingCriteriaList,
    StopStringCriteria,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer

from goose.config import GooseConfig
from goose.cycle.decoder import GenerationResult, GooseDecoder

__all__ = ["FOLDER", "generate", "generate_from_folder", "last_result"]

# The custom_generate folder: model.generate(..., custom_generate=goose.hf.FOLDER, trust_remote_code=True).
FOLDER = str(Path(__file__).with_name("hf_folder"))

logger = logging.getLogger("goose.hf")

# The generate() option behind each logits processor transformers builds, for errors that name it.
_PROCESSOR_OPTIONS = {
    "RepetitionPenaltyLogitsProcessor": "repetition_penalty",
    "EncoderRepetitionPenaltyLogitsProcessor": "encoder_repetition_penalty",
    "MinLengthLogitsProcessor": "min_length/min_new_tokens",
    "MinNewTokensLengthLogitsProcessor": "min_new_tokens",
    "NoRepeatNGramLogitsProcessor": "no_repeat_ngram_size",
    "NoBadWordsLogitsProcessor": "bad_words_ids",
    "SequenceBiasLogitsProcessor": "sequence_bias",
    "PrefixConstrainedLogitsProcessor": "prefix_allowed_tokens_fn",
    "ForcedBOSTokenLogitsProcessor": "forced_bos_token_id",
    "ForcedEOSTokenLogitsProcessor": "forced_eos_token_id",
    "InfNanRemoveLogitsProcessor": "remove_invalid_values",
    "ExponentialDecayLengthPenalty": "exponential_decay_length_penalty",
    "SuppressTokensLogitsProcessor": "suppress_tokens",
    "SuppressTokensAtBeginLogitsProcessor": "begin_suppress_tokens",
    "UnbatchedClassifierFreeGuidanceLogitsProcessor": "guidance_scale",
    "MinPLogitsWarper": "min_p",
    "TypicalLogitsWarper": "typical_p",
    "EpsilonLogitsWarper": "epsilon_cutoff",
    "EtaLogitsWarper": "eta_cutoff",
    "TopHLogitsWarper": "top_h",
    "WatermarkLogitsProcessor": "watermarking_config",
    "SynthIDTextWatermarkLogitsProcessor": "watermarking_config",
}

# GooseConfig's sampling fields: with generate they come from its own options, never from goose_config.
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed")

# Keyword arguments generate() hands every decoding loop; anything else is a model input Goose cannot feed.
_PREPARED_KWARGS = {"attention_mask", "position_ids", "logits_to_keep", "use_cache", "cache", "past_key_values"}


def generate(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer: BaseStreamer | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    goose_config: GooseConfig | dict[str, Any] | None = None,
    goose_seed: int | None = None,
    goose_streamer: BaseStreamer | None = None,
    goose_tokenizer: PreTrainedTokenizerBase | None = None,
    prediction: str | list[int] | torch.Tensor | None = None,
    **model_kwargs: Any,
) -> torch.LongTensor | GenerateDecoderOnlyOutput:
    """The Goose decoding loop, called by ``model.generate(..., custom_generate=goose.hf.generate)``.

    ``streamer``/``tokenizer`` are what a transformers that forwards them would pass (5.24 does
    not; use ``goose_streamer``/``goose_tokenizer``). ``goose_config``: Goose options.
    ``goose_seed``: the seed of a sampled generation (default: drawn from torch's global
    generator, so ``torch.manual_seed`` before ``generate`` makes a sampled call reproducible).
    ``prediction``: the expected output (text needs a tokenizer: the model folder's or ``goose_tokenizer``).
    """
    # transformers has already put the prompt into its own streamer; ours gets it below, as generate does
    try:
        stream_to = _one_streamer(streamer, goose_streamer)
        _check_supported(input_ids, generation_config, synced_gpus, model_kwargs)
        sampling = _sampling_options(generation_config, logits_processor, goose_seed)
        if prediction is not None:
            is_tensor = isinstance(prediction, torch.Tensor)
            sampling["prediction"] = prediction.flatten().tolist() if is_tensor else prediction
        config = _goose_config(goose_config)
        max_length = stopping_criteria.max_length or generation_config.max_length
        if goose_streamer is not None:
            goose_streamer.put(input_ids.cpu())
        state = _model_state(model)
        with state.lock:  # a decoder (its KV cache, its sources) serves one generation at a time
            decoder = _decoder_for(model, state, config, goose_tokenizer if goose_tokenizer is not None else tokenizer)
            state.last_result = None
            try:
                sequence = _decode(decoder, input_ids, max_length - input_ids.shape[1], _eos_ids(generation_config),
                                   sampling, stopping_criteria, stream_to)
            finally:
                decoder.verifier.reset()  # drop the KV cache between calls
            state.last_result = decoder.last_result
    finally:  # each streamer ended once, also on errors, so a thread reading one never hangs
        for to_end in {id(s): s for s in (streamer, goose_streamer) if s is not None}.values():
            to_end.end()
    if generation_config.return_dict_in_generate:
        # no cache comes back: Goose's cache is its own (tree rows, full history), not one generate can resume
        return GenerateDecoderOnlyOutput(sequences=sequence)
    return sequence


def last_result(model: PreTrainedModel) -> GenerationResult | None:
    """The Goose run behind ``model``'s latest ``generate`` through either door: its tokens and ``stats`` (tau, each
    source's tested and accepted drafts, the plugins' ``faults``); None before one, or after a call that failed."""
    state = model.__dict__.get(_STATE_ATTRIBUTE)
    return state.last_result if state is not None else None


def generate_from_folder(
    model: PreTrainedModel,
    streamer: BaseStreamer | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    stop_strings: str | list[str] | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    generation_config: GenerationConfig | None = None,
    goose_streamer: BaseStreamer | None = None,
    **arguments: Any,
) -> torch.LongTensor | GenerateDecoderOnlyOutput:
    """The folder door's entry: ``generate``'s own arguments, ``streamer`` and ``tokenizer`` included.

    It hands them to :func:`generate` under the names that reach a callable: the streamer as
    ``goose_streamer``, the tokenizer as ``goose_tokenizer``, stop strings (the keyword or the
    generation config's) as the ``StopStringCriteria`` that ``stop_strings=`` builds in plain
    ``generate``; then it runs ``model.generate(..., custom_generate=generate)``.
    """
    stream_to = _one_streamer(streamer, goose_streamer)
    if stop_strings is None and generation_config is not None and generation_config.stop_strings is not None:
        stop_strings, generation_config = generation_config.stop_strings, copy.deepcopy(generation_config)
        generation_config.stop_strings = None
    criteria = StoppingCriteriaList(stopping_criteria or [])
    if stop_strings is not None:
        if tokenizer is None:
            raise ValueError("stop_strings needs the tokenizer: pass tokenizer= to generate as well")
        criteria.append(StopStringCriteria(tokenizer, stop_strings))
    if tokenizer is not None:
        arguments["goose_tokenizer"] = tokenizer
    return model.generate(custom_generate=generate, stopping_criteria=criteria, generation_config=generation_config,
                          goose_streamer=stream_to, **arguments)


def _one_streamer(streamer: BaseStreamer | None, goose_streamer: BaseStreamer | None) -> BaseStreamer | None:
    """The streamer given, under either name; both at once is a ValueError."""
    if streamer is not None and goose_streamer is not None:
        raise ValueError("pass the streamer once: streamer= or goose_streamer=, not both")
    return streamer if streamer is not None else goose_streamer


def _decode(
    decoder: GooseDecoder,
    input_ids: torch.LongTensor,
    max_new_tokens: int,
    eos_ids: list[int],
    sampling: dict[str, Any],
    stopping_criteria: StoppingCriteriaList,
    streamer: BaseStreamer | None,
) -> torch.LongTensor:
    """Run the Goose cycle; check the stopping criteria after every token, as plain generate does."""
    length = input_ids.shape[1]
    ids = torch.empty(1, length + max(max_new_tokens, 0), dtype=torch.long, device=input_ids.device)
    ids[:, :length] = input_ids
    chunks = decoder.stream(input_ids[0].tolist(), max_new_tokens, eos_token_ids=eos_ids, **sampling)
    try:
        for chunk in chunks:
            for token in chunk.token_ids:
                ids[0, length] = token
                length += 1
                if streamer is not None:
                    streamer.put(torch.tensor([token]))
                # generate passes the step's scores; Goose has no per-token scores to give (criteria that
                # read them, like the assistant's confidence criterion, cannot be used here)
                if bool(stopping_criteria(ids[:, :length], None).any()):
                    return ids[:, :length]
    finally:
        chunks.close()  # leaving the stream early ends the generation
    return ids[:, :length]


def _check_supported(input_ids: torch.Tensor, config: GenerationConfig, synced_gpus: bool,
                     model_kwargs: dict[str, Any]) -> None:
    """Raise a ValueError naming the first option Goose cannot honour."""

    def refuse(option: str, why: str) -> None:
        raise ValueError(f"goose.hf.generate cannot honour {option}: {why}")

    if (config.num_return_sequences or 1) > 1:
        refuse(f"num_return_sequences={config.num_return_sequences}", "it decodes one sequence per call")
    if (config.num_beams or 1) > 1:
        refuse(f"num_beams={config.num_beams}", "beam search is not speculative decoding's target; use num_beams=1")
    # after the two above: generate repeats the prompt num_beams / num_return_sequences times
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        refuse(f"a batch of {input_ids.shape[0]} prompts", "it decodes one sequence per call; call it per prompt")
    if (config.num_beam_groups or 1) > 1:
        refuse(f"num_beam_groups={config.num_beam_groups}", "group beam search is not supported")
    if config.constraints is not None or config.force_words_ids is not None:
        refuse("constraints/force_words_ids", "constrained beam search is not supported")
    if config.penalty_alpha:
        refuse(f"penalty_alpha={config.penalty_alpha}", "contrastive search is not supported")
    for option in ("prompt_lookup_num_tokens", "assistant_early_exit"):
        if getattr(config, option, None) is not None:
            refuse(option, "Goose is the speculative decoder here; assisted decoding cannot run inside it")
    if getattr(config, "use_mtp", False):
        refuse("use_mtp", "Goose is the speculative decoder here; assisted decoding cannot run inside it")
    if config.return_dict_in_generate:
        for option in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
            if getattr(config, option, False):
                refuse(f"{option}=True", "Goose verifies drafts in trees and keeps no per-token scores, "
                       "logits, attentions or hidden states")
    if synced_gpus:
        refuse("synced_gpus=True", "it runs on one process")
    unknown = sorted(set(model_kwargs) - _PREPARED_KWARGS)
    if unknown:
        refuse(f"the model input(s) {', '.join(unknown)}", "Goose feeds the model token ids only")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        refuse("an attention_mask with padding", "pass the prompt's tokens without padding")
    positions = model_kwargs.get("position_ids")
    if positions is not None and not torch.equal(positions.flatten().cpu(), torch.arange(input_ids.shape[1])):
        refuse("custom position_ids", "Goose places the prompt at positions 0..n-1")
    for key in ("cache", "past_key_values"):
        cache = model_kwargs.get(key)
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            refuse("a filled past_key_values cache", "Goose prefills the whole prompt into its own cache")


def _sampling_options(config: GenerationConfig, processors: LogitsProcessorList, seed: int | None) -> dict[str, Any]:
    """Goose's sampling parameters from the processors generate built; anything but a pure warper is refused.

    Greedy: warpers never change the argmax, so they are harmless there. Sampling: temperature,
    top-k and top-p as generate applies them (its defaults included, e.g. ``top_k=50``).
    """
    options: dict[str, Any] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    seen: list[type] = []
    refused: list[str] = []
    for processor in processors:
        if isinstance(processor, LogitNormalization):
            continue  # a log-softmax: the distribution is unchanged
        if isinstance(processor, TemperatureLogitsWarper):
            options["temperature"] = float(processor.temperature)
        elif isinstance(processor, TopKLogitsWarper):
            options["top_k"] = int(processor.top_k)
        elif isinstance(processor, TopPLogitsWarper):
            options["top_p"] = float(processor.top_p)
        else:
            name = type(processor).__name__
            refused.append(f"{_PROCESSOR_OPTIONS.get(name, 'logits_processor')} ({name})")
            continue
        if type(processor) in seen:
            raise ValueError(f"goose.hf.generate: {type(processor).__name__} given twice (logits_processor= and "
                             "the generation config); give it once")
        if getattr(processor, "min_tokens_to_keep", 1) != 1:
            raise ValueError(f"goose.hf.generate cannot honour min_tokens_to_keep={processor.min_tokens_to_keep}")
        seen.append(type(processor))
    if refused:  # all of them at once, so one error tells the whole story
        raise ValueError(f"goose.hf.generate cannot honour {', '.join(refused)}: Goose verifies drafts against the "
                         "model's own distribution, which only temperature, top_k and top_p may shape")
    if TopPLogitsWarper in seen and TemperatureLogitsWarper in seen and \
            seen.index(TopPLogitsWarper) < seen.index(TemperatureLogitsWarper):
        raise ValueError("goose.hf.generate applies temperature before top_p (as generate does); "
                         "a TopPLogitsWarper before the temperature cannot be honoured")
    if not config.do_sample:
        return {"temperature": 0.0}
    if seed is None:  # one draw from torch's global generator: torch.manual_seed(s) makes the call reproducible
        seed = int(torch.randint(0, 2**63 - 1, ()))
    return {**options, "seed": seed}


def _goose_config(value: GooseConfig | dict[str, Any] | None) -> GooseConfig:
    """The Goose options; sampling is generate's business (do_sample, temperature, top_k, top_p, goose_seed)."""
    if value is None:
        return GooseConfig()
    if isinstance(value, dict):
        try:
            value = GooseConfig.model_validate(value)
        except ValidationError as error:
            raise ValueError(f"goose_config: {error}") from None
    if not isinstance(value, GooseConfig):
        raise ValueError(f"goose_config must be a GooseConfig or a dict of its fields, not {type(value).__name__}")
    defaults = GooseConfig()
    sampling = [name for name in _SAMPLING_FIELDS if getattr(value, name) != getattr(defaults, name)]
    if sampling:
        raise ValueError(f"goose_config sets {', '.join(sampling)}: with generate, sample through do_sample=True, "
                         "temperature, top_k, top_p and goose_seed=")
    return value


def _eos_ids(config: GenerationConfig) -> list[int]:
    """The EOS ids generate stops at (its criterion is applied too; this stops Goose drafting past them)."""
    eos = config.eos_token_id
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(t) for t in eos]


class _ModelState:
    """What goose.hf keeps per model: its tokenizer, its decoders by configuration, one lock.

    Kept as an attribute of the model, so it dies with the model (a module-level cache keyed by the
    model would keep it alive: the decoders hold the model). Pickling or copying the model gives an
    empty one: decoders and locks are not state worth saving.
    """

    def __init__(self) -> None:
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.tokenizer_looked_up = False
        self.decoders: dict[tuple[str, str, str], GooseDecoder] = {}
        self.last_result: GenerationResult | None = None  # the latest generate's, for last_result()
        self.lock = threading.Lock()

    def __reduce__(self) -> tuple[type, tuple]:
        return _ModelState, ()


_STATE_ATTRIBUTE = "_goose_hf_state"
_state_lock = threading.Lock()


def _model_state(model: PreTrainedModel) -> _ModelState:
    with _state_lock:
        state = model.__dict__.get(_STATE_ATTRIBUTE)
        if state is None:
            state = _ModelState()
            model.__dict__[_STATE_ATTRIBUTE] = state
        return state


def _decoder_for(model: PreTrainedModel, state: _ModelState, config: GooseConfig,
                 tokenizer: PreTrainedTokenizerBase | None) -> GooseDecoder:
    """The model's decoder for ``config``, built once (it loads the cost curve, its sources keep their tables)."""
    parameter = next(model.parameters())
    key = (config.model_dump_json(), str(parameter.device), str(parameter.dtype))
    decoder = state.decoders.get(key)
    if decoder is None:
        decoder = GooseDecoder(model, _tokenizer_for(model, state, tokenizer), config)
        state.decoders[key] = decoder
    return decoder


def _tokenizer_for(model: PreTrainedModel, state: _ModelState,
                   given: PreTrainedTokenizerBase | None) -> PreTrainedTokenizerBase | None:
    """The decoder's tokenizer: the one given, else the one in the model's folder, else none.

    Output ids never depend on it (prompts arrive as ids); sources may (REST builds its default
    datastore with it), so one is looked for once per model.
    """
    if given is not None:
        return given
    if not state.tokenizer_looked_up:
        state.tokenizer_looked_up = True
        try:
            state.tokenizer = AutoTokenizer.from_pretrained(getattr(model, "name_or_path", "") or "")
        except (OSError, ValueError) as error:
            logger.info("goose.hf: no tokenizer next to %r (%s); decoding without one", model.name_or_path, error)
    return state.tokenizer

"""Structured outputs: a JSON schema (or any JSON object) as a grammar over tokens, applied to draft trees.

The grammar is llguidance's: a JSON schema compiles to a matcher that, given the tokens so far, says which
tokens may come next as a bitmask over the vocabulary (32 tokens a word). A request's :class:`Constraint`
keeps one matcher at the committed output and uses it three ways per cycle, between the topology's plan
and the verify pass and in the walk:

- it walks the planned tree depth-first, consuming each node's token and rolling it back on the way up,
  so every node's row gets the mask of the grammar state *after* that node (the state its row predicts
  from), one [tree rows, words] array;
- a drafted token its parent's mask forbids is cut with its whole subtree before verification (it could
  never be accepted, and would cost a row for nothing); the count goes to ``grammar_cut_tokens``;
- the verified rows are masked on the device in one pass (forbidden tokens get -inf), so the greedy walk
  takes the argmax of the masked row and the sampled walk draws from the masked distribution.

The autoregressive loop masks its one row per step with the same matcher state, so constrained Goose is
token-identical to constrained autoregressive decoding, greedy or seeded. End of output: the request's
EOS tokens are allowed exactly where the grammar accepts (llguidance's own EOS bit is replaced by them),
so once the JSON is complete only EOS remains and the output ends there.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, ClassVar

import llguidance
import llguidance.hf
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from goose.contract.tree import ROOT, DraftTree

# JSON mode (OpenAI's response_format {"type": "json_object"}): any JSON object
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
_WORD_BITS = 32
_ALL_ALLOWED = np.int32(-1)  # every bit set
_COMPILED_KEPT = 64  # compiled grammars kept per tokenizer (a server sees the same few schemas again and again)


class GrammarError(ValueError):
    """A structured output that cannot be: a schema that does not compile, or one without an EOS to end on."""


def schema_text(json_schema: dict[str, Any] | str | None, json_object: bool) -> str | None:
    """The schema a request asks for, as canonical JSON text (the compile cache's key); None when unconstrained.

    ValueError when both are given or the schema is not a JSON object.
    """
    if json_schema is None:
        return json.dumps(JSON_OBJECT_SCHEMA) if json_object else None
    if json_object:
        raise GrammarError("give json_schema or json_object, not both (a schema already says what object to produce)")
    try:
        schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
    except json.JSONDecodeError as error:
        raise GrammarError(f"json_schema is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise GrammarError(f"json_schema must be a JSON object (a dict), not {type(schema).__name__}")
    return json.dumps(schema)  # key order kept: the grammar lays properties in it


class GrammarCompiler:
    """Compiles schemas for one tokenizer: llguidance's view of the vocabulary (built once, ~1 s) and the
    compiled matchers of recent schemas (each request gets its own copy)."""

    _by_tokenizer: ClassVar[dict[tuple[int, int], GrammarCompiler]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise GrammarError("structured outputs need a fast (Rust) tokenizer; this model's tokenizer is not one")
        self.tokenizer = tokenizer  # kept alive so its id stays this compiler's key
        self.vocab_size = vocab_size
        self.words = (vocab_size + _WORD_BITS - 1) // _WORD_BITS
        self.grammar_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase | None, vocab_size: int) -> GrammarCompiler:
        """The compiler of ``tokenizer`` (made on first use and shared by every decoder of that tokenizer)."""
        if tokenizer is None:
            raise GrammarError("structured outputs need the model's tokenizer; pass it to the decoder")
        with cls._lock:
            key = (id(tokenizer), vocab_size)
            compiler = cls._by_tokenizer.get(key)
            if compiler is None or compiler.tokenizer is not tokenizer:
                compiler = cls._by_tokenizer[key] = cls(tokenizer, vocab_size)
            return compiler

    def matcher(self, schema: str) -> llguidance.LLMatcher:
        """A fresh matcher at the start of ``schema``'s grammar; ValueError naming what cannot be compiled."""
        with self._lock:
            compiled = self._compiled.get(schema)
            if compiled is None:
                try:
                    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
                except ValueError as error:
                    raise GrammarError(f"json_schema cannot be compiled: {error}") from None
                compiled = llguidance.LLMatcher(self.grammar_tokenizer, grammar, log_level=0)
                if compiled.is_error():
                    raise GrammarError(f"json_schema cannot be compiled: {compiled.get_error().strip()}")
                self._compiled[schema] = compiled
                if len(self._compiled) > _COMPILED_KEPT:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(schema)
            return compiled.deep_copy()


class Constraint:
    """One request's grammar: the matcher at its committed output, the masks and cuts of each tree.

    ``seconds`` (the grammar's own time: masks, cuts, masking, advancing) and ``cut_tokens`` (drafted tokens
    the grammar forbade, cut before verification) add up over the request.
    """

    def __init__(self, compiler: GrammarCompiler, schema: str, eos_ids: Iterable[int]) -> None:
        eos = sorted(int(token) for token in eos_ids if 0 <= int(token) < compiler.vocab_size)
        if not eos:
            raise GrammarError("a structured output needs an end-of-sequence token to end on "
                             "(ignore_eos or an empty eos_token_ids cannot go with a json_schema)")
        self.matcher = compiler.matcher(schema)
        self.words = compiler.words
        self.eos_ids = frozenset(eos)
        # the bits every mask changes, worked out once: llguidance's own EOS cleared, the request's set where
        # the grammar accepts
        self._grammar_eos = _TokenBits(_tokenizer_eos(compiler.grammar_tokenizer))
        self._eos = _TokenBits(eos)
        self.seconds = 0.0
        self.cut_tokens = 0
        self._shifts: dict[torch.device, torch.Tensor] = {}

    # --- the committed state ------------------------------------------------------------------------

    def advance(self, tokens: list[int]) -> None:
        """Consume the tokens the request kept (an EOS ends the output, so it is not consumed)."""
        started = time.perf_counter()
        for token in tokens:
            if token in self.eos_ids:
                break
            if not self.matcher.consume_token(token):
                raise RuntimeError(f"the grammar refused kept token {token}: {self.matcher.get_error().strip()}")
        self.seconds += time.perf_counter() - started

    # --- one cycle ----------------------------------------------------------------------------------

    def plan(self, tree: DraftTree) -> tuple[DraftTree, np.ndarray]:
        """The tree without the drafted tokens the grammar forbids (and their subtrees), and the bitmask
        int32 [rows, words] of every remaining row: bit t of row i is set when token t may follow node i."""
        started = time.perf_counter()
        n = tree.size
        masks = np.zeros((n, self.words), dtype=np.int32)
        keep = np.zeros(n, dtype=np.bool_)
        keep[ROOT] = True
        children: list[list[int]] = [[] for _ in range(n)]
        for node, parent in enumerate(tree.parents.tolist()):
            if parent >= 0:
                children[parent].append(node)
        tokens = tree.tokens.tolist()
        self._visit(ROOT, tokens, children, masks, keep)
        kept = int(keep.sum())
        self.cut_tokens += n - kept
        if kept < n:
            tree, masks = tree.keeping(keep), masks[keep]
        self.seconds += time.perf_counter() - started
        return tree, masks

    def next_mask(self) -> np.ndarray:
        """The bitmask int32 [1, words] of the next token at the committed state (the autoregressive step)."""
        started = time.perf_counter()
        mask = np.zeros((1, self.words), dtype=np.int32)
        self._fill(mask[0])
        self.seconds += time.perf_counter() - started
        return mask

    def apply(self, logits: torch.Tensor, masks: np.ndarray) -> None:
        """Set the forbidden tokens of the first ``len(masks)`` rows of ``logits`` [rows, V] to -inf, in place.

        On an accelerator the bitmask travels (32 tokens a word) and is unpacked and applied there. On the CPU
        the rows are rewritten through their bits with NumPy's vectorised integer ops (value AND keep, OR -inf
        where forbidden): torch's ``masked_fill_`` is several times slower there and fights the model's threads.
        """
        started = time.perf_counter()
        rows = logits[: masks.shape[0]]
        with torch.inference_mode():  # the verifier's logits are inference tensors
            if rows.device.type == "cpu" and rows.is_contiguous() and rows.dtype in _MINUS_INFINITY_BITS:
                _mask_on_host(rows, masks)
            else:
                shifts = self._shifts.get(rows.device)
                if shifts is None:
                    shifts = self._shifts[rows.device] = torch.arange(_WORD_BITS, dtype=torch.int32,
                                                                      device=rows.device)
                words = torch.from_numpy(masks).to(rows.device, non_blocking=True)
                allowed = ((words[:, :, None] >> shifts) & 1).flatten(1)[:, : rows.shape[-1]]
                rows.masked_fill_(allowed == 0, float("-inf"))
        self.seconds += time.perf_counter() - started

    # --- the depth-first walk of a tree ------------------------------------------------------------

    def _visit(self, node: int, tokens: list[int], children: list[list[int]], masks: np.ndarray,
               keep: np.ndarray) -> None:
        """Fill ``node``'s mask (the matcher is at the state after ``node``), keep its allowed children and
        visit them, the matcher consuming each child's token on the way down and rolling it back after."""
        mask = masks[node]
        self._fill(mask)
        for child in children[node]:
            token = tokens[child]
            if not (int(mask[token >> 5]) >> (token & 31)) & 1:
                continue  # forbidden: the child and its subtree are cut
            keep[child] = True
            if token in self.eos_ids:
                masks[child] = _ALL_ALLOWED  # the output ends at this EOS: its row is never read, its children go
                continue
            self.matcher.consume_token(token)
            self._visit(child, tokens, children, masks, keep)
            self.matcher.rollback(1)

    def _fill(self, mask: np.ndarray) -> None:
        """``mask`` (int32 [words]) := the tokens allowed at the matcher's state, EOS where the grammar accepts."""
        self.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        self._grammar_eos.clear(mask)
        if self.matcher.is_accepting():
            self._eos.set(mask)


_INTEGER_OF_SIZE = {4: torch.int32, 2: torch.int16}  # float32; bfloat16 and float16
# -inf of each float type as the integer of its size holds it
_MINUS_INFINITY_BITS = {dtype: int(torch.tensor(float("-inf"), dtype=dtype).view(_INTEGER_OF_SIZE[size]).item())
                        for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2), (torch.float16, 2))}


def _mask_on_host(rows: torch.Tensor, masks: np.ndarray) -> None:
    """-inf (the dtype's own bit pattern) in the forbidden places of the CPU float rows [n, V], in place."""
    minus_infinity = _MINUS_INFINITY_BITS[rows.dtype]
    values = rows.view(_INTEGER_OF_SIZE[rows.element_size()]).numpy()  # the logits' own memory, as integers
    keep = np.unpackbits(masks.view(np.uint8), axis=1, count=values.shape[1], bitorder="little").astype(values.dtype)
    np.negative(keep, out=keep)  # all bits set where the token is allowed, none where it is forbidden
    np.bitwise_and(values, keep, out=values)
    np.invert(keep, out=keep)
    np.bitwise_and(keep, values.dtype.type(minus_infinity), out=keep)
    np.bitwise_or(values, keep, out=values)


class _TokenBits:
    """A few tokens' places in an int32 bitmask [words] (their words and bits), to set or clear in one call each."""

    def __init__(self, tokens: Iterable[int]) -> None:
        ids = np.asarray(sorted(tokens), dtype=np.int64)
        self.words = ids >> 5
        self.bits = (np.uint32(1) << (ids & 31).astype(np.uint32)).astype(np.uint32)
        self.cleared = ~self.bits

    def set(self, mask: np.ndarray) -> None:
        np.bitwise_or.at(mask.view(np.uint32), self.words, self.bits)  # .at: two tokens may share a word

    def clear(self, mask: np.ndarray) -> None:
        np.bitwise_and.at(mask.view(np.uint32), self.words, self.cleared)


def _tokenizer_eos(grammar_tokenizer: llguidance.LLTokenizer) -> set[int]:
    """The EOS token(s) llguidance allows where the grammar accepts (replaced by the request's own)."""
    return {int(token) for token in grammar_tokenizer.eos_tokens}

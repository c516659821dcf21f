"""goose-phrase-list: draft the rest of a known phrase once the output has started it.

Some text is predictable because the *user* knows it: an API's function names, a house style's
boilerplate, the fixed wording of a report. Given a list of such phrases, this source watches the
context's tail; when it ends with the first k >= ``min_match`` tokens of a phrase, it proposes the
phrase's remaining tokens. Several phrases starting the same way are merged into a small trie.

It is a third-party Goose plugin: it registers itself through the ``goose`` entry-point group
(see ``pyproject.toml``) and touches nothing in goose's repository. Options come from
``GooseConfig.source_options["phrase_list"]``::

    {"phrases": ["def merge_sorted_lists(", [1045, 2213, 87]],   # text, or token ids
     "path": "phrases.txt",                                       # one phrase per line
     "min_match": 2}

Sources only ever see token ids. Phrases given as token-id lists are used as they are; phrases
given as text are tokenized lazily, at the first prefill, with the model's tokenizer
(``DecodeContext.tokenizer``), both as written and with a leading space (byte-level BPE
tokenizers spell a word differently after a space, and a phrase usually follows one).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import goose
import numpy as np
from goose.config import GooseConfig
from goose.contract.candidates import DecodeContext, Draft
from goose.hookspecs import Register
from pydantic import BaseModel, ConfigDict, Field

NAME = "phrase_list"

__all__ = ["NAME", "PhraseListOptions", "PhraseListSource", "PhraseTrie", "goose_register_sources"]


class PhraseListOptions(BaseModel):
    """Options of the phrase-list source (``GooseConfig.source_options["phrase_list"]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    phrases: list[str | list[int]] = Field(default_factory=list, description="phrases as text or as token-id lists")
    path: Path | None = Field(default=None, description="UTF-8 file, one phrase per line ('#' lines are comments)")
    min_match: int = Field(default=2, ge=1, description="phrase tokens the context must end with before drafting")
    max_draft: int = Field(default=32, ge=1, description="most tokens drafted per phrase")
    leading_space: bool = Field(default=True, description="also tokenize ' ' + phrase for text phrases")


class PhraseTrie:
    """Phrases as token-id tuples, indexed by the last ``key`` tokens of every prefix worth matching.

    ``starts[key]`` lists (phrase, k): phrase[:k] ends with ``key`` and k >= min_match, k < len.
    A lookup is one dict probe on the context's last tokens plus a comparison per candidate, so the
    cost per cycle does not grow with the context (and barely with the number of phrases).
    """

    def __init__(self, phrases: list[tuple[int, ...]], min_match: int) -> None:
        self.phrases = sorted({p for p in phrases if len(p) > min_match})  # need >= 1 token left to draft
        self.key = min(2, min_match)
        self.longest = max((len(p) for p in self.phrases), default=0)
        self.starts: dict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)
        for index, phrase in enumerate(self.phrases):
            for k in range(min_match, len(phrase)):
                self.starts[phrase[k - self.key : k]].append((index, k))

    def __len__(self) -> int:
        return len(self.phrases)

    def continuations(self, tokens: np.ndarray) -> list[tuple[int, ...]]:
        """The rests of the phrases whose longest started prefix the context ends with (longest k only)."""
        if not self.phrases or tokens.shape[0] < self.key:
            return []
        tail = tokens[-self.longest :].tolist()
        candidates = self.starts.get(tuple(tail[-self.key :]), [])
        best, found = 0, []
        for index, k in candidates:
            phrase = self.phrases[index]
            if k < best or k > len(tail) or tail[-k:] != list(phrase[:k]):
                continue
            if k > best:
                best, found = k, []
            found.append(phrase[k:])
        return found


class PhraseListSource:
    """Drafts the rest of a phrase the context has started; one instance per decoder."""

    name = NAME

    def __init__(self, config: GooseConfig) -> None:
        self.options = PhraseListOptions.model_validate(config.options_for(NAME))
        self.texts: list[str] = [p for p in self.options.phrases if isinstance(p, str)]
        self.token_phrases: list[tuple[int, ...]] = [tuple(p) for p in self.options.phrases if not isinstance(p, str)]
        if self.options.path is not None:  # read now: a wrong path fails when the decoder is made
            try:
                lines = self.options.path.read_text(encoding="utf-8").splitlines()
            except OSError as error:
                raise FileNotFoundError(f"phrase_list: cannot read phrase file {self.options.path}: {error}") from None
            self.texts += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not self.texts and not self.token_phrases:
            raise ValueError("phrase_list: no phrases; set source_options.phrase_list.phrases or .path")
        self.trie: PhraseTrie | None = None
        self.proposals = self.matched = 0

    # --- hooks --------------------------------------------------------------------------------

    @goose.hookimpl
    def goose_prefill(self, context: DecodeContext) -> None:
        self._index(context)

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext, acceptance: float) -> Draft | None:
        trie = self._index(context)
        self.proposals += 1
        rests = trie.continuations(context.tokens)
        rests = [rest[: self.options.max_draft] for rest in rests if rest]
        if not rests:
            return None
        self.matched += 1
        # a trie where the matched phrases part; each phrase is one piece of evidence
        return Draft.trie(rests, [1.0] * len(rests), acceptance)

    # --- helpers ------------------------------------------------------------------------------

    def _index(self, context: DecodeContext) -> PhraseTrie:
        """The phrase index, built once: text phrases need the model's tokenizer, which arrives with the context."""
        if self.trie is not None:
            return self.trie
        phrases = list(self.token_phrases)
        if self.texts:
            if context.tokenizer is None:
                raise ValueError("phrase_list: text phrases need the model's tokenizer (DecodeContext.tokenizer); "
                                 "give the phrases as token-id lists instead")
            phrases += [tuple(ids) for ids in tokenize(context.tokenizer, self.texts, self.options.leading_space)]
        outside = [p for p in phrases if any(t < 0 or t >= context.vocab_size for t in p)]
        if outside:
            raise ValueError(f"phrase_list: {len(outside)} phrase(s) hold token ids outside the vocabulary "
                             f"[0, {context.vocab_size}), e.g. {list(outside[0])}")
        self.trie = PhraseTrie(phrases, self.options.min_match)
        return self.trie


def tokenize(tokenizer: Any, texts: list[str], leading_space: bool) -> list[list[int]]:
    """Token ids of every text (and of ' ' + text), without special tokens such as BOS."""
    variants = texts + ([" " + text for text in texts if not text.startswith(" ")] if leading_space else [])
    return [list(tokenizer.encode(text, add_special_tokens=False)) for text in variants]


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, PhraseListSource, description="drafts the rest of a user-supplied phrase the output has started",
             initial_acceptance=0.6)

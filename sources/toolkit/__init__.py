"""The source author's toolkit: the helpers the built-in sources share (no source imports another).

* **Stops** (:mod:`.stops`): ``before_eos`` cuts one copied continuation before its first EOS;
  ``cut_at_stops`` ends many continuation rows at EOS, document ends and ids outside the vocabulary.
* **Comparing drafts**: ``common_prefix`` (how far two token runs agree: consensus between
  matches) and ``without_trailing_repeats`` (a ``Draft.depth_acceptance`` in its shortest form);
  both live in :mod:`goose.contract.candidates`, which the core uses too.
* **Acceptance by copy depth** (:mod:`.copy_depth`): ``CopyDepthEstimate``, and the option
  validators ``longest_first`` (n-gram ladders), ``increasing_edges`` (depth bins) and
  ``probability_ladder`` (a prior per depth bin).
* **Frequency tries** (:mod:`.frequency_trie`): ``frequency_trie`` merges continuations into a
  trie with counts and scores (``FrequencyTrie``).
* **Following the context** (:mod:`.fingerprint`): ``ContextFingerprint`` notices, in O(1), a
  context that does not continue the one indexed so far.
* **Stored token ids** (:mod:`.tokenizers`): ``context_identity`` and ``same_tokenizer`` refuse a
  file written for another tokenizer.
* **Memory of earlier requests** (:mod:`.ngram_memory`, imported on its own: it is large).
"""

from goose.contract.candidates import common_prefix, without_trailing_repeats
from goose.sources.toolkit.copy_depth import CopyDepthEstimate, increasing_edges, longest_first, probability_ladder
from goose.sources.toolkit.fingerprint import ContextFingerprint
from goose.sources.toolkit.frequency_trie import FrequencyTrie, frequency_trie
from goose.sources.toolkit.stops import before_eos, cut_at_stops
from goose.sources.toolkit.tokenizers import context_identity, same_tokenizer

__all__ = [
    "ContextFingerprint",
    "CopyDepthEstimate",
    "FrequencyTrie",
    "before_eos",
    "common_prefix",
    "context_identity",
    "cut_at_stops",
    "frequency_trie",
    "increasing_edges",
    "longest_first",
    "probability_ladder",
    "same_tokenizer",
    "without_trailing_repeats",
]

"""The decode cycle (``session``: draft, plan, verify, walk, observe, for one request or many) and its pieces.

``decoder`` (the front door: GooseDecoder, the autoregressive reference), ``request``, ``drafting``
(a decoder's sources, topology and planner; one row's side of the cycle), ``verifier`` (the target
model over the trees, and its KV cache), ``readout``, ``walker``, ``sampling``, ``logprobs``,
``stats``, ``detokenize``, ``attention`` and ``calibration`` (the device's cost curve, measured).
"""

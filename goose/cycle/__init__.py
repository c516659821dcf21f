"""The decode cycle: draft, plan, verify, walk, observe (``decoder``), and the pieces it runs on.

``verifier`` (the target model over a tree, and its KV cache), ``readout`` (one device read of
a pass's logits), ``walker`` (the longest accepted path, greedy and sampled), ``sampling`` (the
seeded sampler both Goose and the autoregressive loop draw from), ``logprobs`` (the output tokens' log
probabilities, read from the pass that accepted them), ``stats`` and ``detokenize``.
"""

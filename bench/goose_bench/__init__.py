"""``goose bench``: the paper's tables reproduced on real models, side by side with the peers.

One concept a module:

- :mod:`goose_bench.prompts`: benchmark files -> :class:`Sample` (formatted turns, per dataset).
- :mod:`goose_bench.conversation`: a sample's turns -> prompt token ids (chat template or plain text).
- :mod:`goose_bench.methods`: the methods as data (name -> GooseConfig fields), suites, availability.
- :mod:`goose_bench.generators`: one method's generation of one turn, all behind one interface.
- :mod:`goose_bench.runner`: warm-up, interleaved timing, per-sample records, progress bar.
- :mod:`goose_bench.records`: a sample's record (Spec-Bench fields plus ours).
- :mod:`goose_bench.aggregate`: records -> summary rows (the paper's aggregation).
- :mod:`goose_bench.report`: summary -> ``report.md`` (the paper's tables).
- :mod:`goose_bench.plots`: summary -> PNG plots.
- :mod:`goose_bench.outputs`: summaries -> ``summary.json``, ``report.md`` and the plots in ``--out``.
- :mod:`goose_bench.cli`: the ``goose bench`` command.

Nothing here imports torch or transformers at import time except the modules that generate, so
``goose --help`` stays fast.
"""

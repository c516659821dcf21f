"""``goose bench``: the paper's tables reproduced on real models, side by side with the peers.

One concept a module:

- :mod:`goose.bench.prompts`: benchmark files -> :class:`Sample` (formatted turns, per dataset).
- :mod:`goose.bench.conversation`: a sample's turns -> prompt token ids (chat template or plain text).
- :mod:`goose.bench.methods`: the methods as data (name -> GooseConfig fields), suites, availability.
- :mod:`goose.bench.generators`: one method's generation of one turn, all behind one interface.
- :mod:`goose.bench.runner`: warm-up, interleaved timing, per-sample records, progress bar.
- :mod:`goose.bench.records`: a sample's record (Spec-Bench fields plus ours).
- :mod:`goose.bench.aggregate`: records -> summary rows (the paper's aggregation).
- :mod:`goose.bench.report`: summary -> ``report.md`` (the paper's tables).
- :mod:`goose.bench.plots`: summary -> PNG plots.
- :mod:`goose.bench.outputs`: summaries -> ``summary.json``, ``report.md`` and the plots in ``--out``.
- :mod:`goose.bench.cli`: the ``goose bench`` command.

Nothing here imports torch or transformers at import time except the modules that generate, so
``goose --help`` stays fast.
"""

"""The plugin contract's data and its guard: what crosses a hook, and the one place that checks it.

``candidates`` (the context a source sees, its drafts, the pool a topology plans from), ``tree``
(the draft tree and its builder), ``outcome`` (what a verification tells the sources),
``acceptance`` (the per-source acceptance estimate) and ``boundary`` (every call into a plugin,
guarded). The hooks themselves are specified in :mod:`goose.hookspecs`.
"""

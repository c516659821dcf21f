"""The plugin contract's data: what crosses a hook.

``candidates`` (the context a source sees, its drafts, the pool a topology plans from), ``tree``
(the draft tree and its builder), ``outcome`` (what a verification tells the sources) and
``acceptance`` (the per-source acceptance estimate). The hooks themselves are specified in
:mod:`goose.hookspecs`; every call into a plugin is guarded in :mod:`goose.boundary`, beside the
registry (:mod:`goose.plugins`).
"""

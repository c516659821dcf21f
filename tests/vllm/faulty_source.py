"""A Goose source that fails every time it is asked to draft: the fault-isolation test's culprit.

Registered at run time inside vLLM's engine process through the proposer's ``plugins`` option.
"""

from __future__ import annotations

import goose
from goose.contract.candidates import DecodeContext, Draft
from goose.hookspecs import Register

NAME = "faulty"
MESSAGE = "this source always fails"


class FaultySource:
    def __init__(self, config: goose.GooseConfig) -> None:
        self.config = config

    @goose.hookimpl
    def goose_propose(self, context: DecodeContext, acceptance: float) -> Draft | None:
        raise RuntimeError(MESSAGE)


@goose.hookimpl
def goose_register_sources(register: Register) -> None:
    register(NAME, FaultySource, description="raises in goose_propose (tests only)")

"""uvicorn's server, stopping the engine first on Ctrl-C / SIGTERM so that clients get a 503 at once.

uvicorn waits for open connections before it runs the app's shutdown; without this a generation
would run on until the graceful-shutdown timeout cut it off with a 500.
"""

from __future__ import annotations

import threading
from types import FrameType

import uvicorn

from goose.serve.engine import Engine


class EngineServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:  # close() waits for the worker: not on the event loop's thread
            threading.Thread(target=self.engine.close, name="goose-serve-close", daemon=True).start()
        super().handle_exit(sig, frame)

"""goose-bench's tests share Goose's test fixtures (the models loaded once per session, tests/conftest.py): imported
here, so that `pytest bench/tests` alone finds them too; with `pytest tests bench/tests` both name the same
functions."""

from tests.conftest import smollm2, tiny, tiny_gemma3

__all__ = ["smollm2", "tiny", "tiny_gemma3"]

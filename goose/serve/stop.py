"""Stop sequences over streamed text: cut at the first stop string, even one split across chunks."""

from __future__ import annotations


class StopScanner:
    """Feed the output text chunk by chunk; get back the text that is safe to send.

    Text that might be the start of a stop string is held back until the next chunk decides it,
    so a stop string split across two cycles is still caught and never half-sent.
    """

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self.pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self.pending + text
        hits = [index for index in (buffer.find(stop) for stop in self.stops) if index >= 0]
        if hits:
            self.stopped = True
            self.pending = ""
            return buffer[: min(hits)]
        held = self._undecided_tail(buffer)
        self.pending = buffer[len(buffer) - held :]
        return buffer[: len(buffer) - held]

    def flush(self) -> str:
        """The held-back text once the output has ended without a stop string."""
        text, self.pending = self.pending, ""
        return text

    def _undecided_tail(self, buffer: str) -> int:
        """Length of the longest end of ``buffer`` that begins some stop string."""
        longest = min(len(buffer), max(len(stop) for stop in self.stops) - 1)
        for length in range(longest, 0, -1):
            tail = buffer[-length:]
            if any(stop.startswith(tail) for stop in self.stops):
                return length
        return 0

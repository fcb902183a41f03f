"""Progress of a long pass over the corpus (reading, training the tokenizer, encoding): documents,
tokens, tokens/s and the time left. On a terminal a tqdm bar on stderr; elsewhere (a job's log file) a
plain line on stdout every `every` seconds, so logs show progress without a bar's control characters
and stderr keeps only errors.
"""

from __future__ import annotations

import os
import sys
import time

# The bar with its counts at their longest (a billion documents, hours left) is about 140 columns.
UNSIZED_COLUMNS = 160


def _si(value: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(value) < 1000 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "" else f"{value:.1f}{unit}"
        value /= 1000
    return str(value)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, what: str, total_bytes: float, every: float = 30.0, stream=None):
        self.what, self.total, self.every = what, max(total_bytes, 1.0), every
        self.bytes = 0.0
        self.documents = self.tokens = 0
        self.started = self._printed = time.monotonic()
        stream = stream or sys.stderr
        self.bar = None
        if stream.isatty():
            from tqdm import tqdm

            size = os.get_terminal_size(stream.fileno())  # 0 x 0 on a terminal nobody sized (script, CI)
            # Unsized: wide enough for the whole line at any speed (tqdm cuts what does not fit, and at
            # 100 columns a fast run lost its tokens/s: "808.5k tokens/").
            self.bar = tqdm(
                total=self.total,
                desc=what,
                unit="B",
                unit_scale=True,
                file=stream,
                ncols=size.columns or UNSIZED_COLUMNS,
                nrows=size.lines or 24,  # tqdm hides bars below the last row: all of them on 0 rows
                smoothing=0.05,
            )

    def update(self, nbytes: float = 0.0, documents: int = 0, tokens: int = 0) -> None:
        self.bytes += nbytes
        self.documents += documents
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(min(nbytes, self.total - self.bar.n))
            self.bar.set_postfix_str(self._counts(), refresh=False)
        elif time.monotonic() - self._printed >= self.every:
            self._printed = time.monotonic()
            print(self.line(), flush=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _counts(self) -> str:
        rate = self.tokens / max(self.elapsed, 1e-9)
        tokens = f", {_si(self.tokens)} tokens, {_si(rate)} tokens/s" if self.tokens else ""
        return f"{self.documents:,} documents{tokens}"

    def line(self) -> str:
        done = min(self.bytes / self.total, 1.0)
        left = self.elapsed * (1 - done) / done if done > 0 else float("nan")
        eta = _clock(left) if left == left else "?"
        return f"{self.what}: {done:.0%} of {_si(self.total)}B, {self._counts()}, {_clock(self.elapsed)} elapsed, {eta} left"

    def close(self) -> float:
        if self.bar is not None:
            self.bar.close()
        return self.elapsed

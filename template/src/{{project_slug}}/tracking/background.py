"""A tracker on a thread of its own: training hands it records and never waits for it.

The thread starts the tracker (a server's handshake, W&B's service process), then logs each record
in order. Any exception there, from the start or a log, is one warning line naming the tracker and
what went wrong; the tracker then drops what follows, and training goes on (metrics.jsonl keeps
everything). A queue of QUEUE_LIMIT records stands for a server slower than the steps: past it,
records are dropped, said once. close() lets the thread finish what is queued for CLOSE_SECONDS at
most, so a hung server cannot hold the end of a run. A run that fails or crashes closes its trackers
too, as its process ends (an exit hook: runtime/process_exit.py runs them on every way out), and
they mark their runs failed there.
"""

from __future__ import annotations

import atexit
import functools
import queue
import threading
from typing import Protocol

from ..settings.stored_files import warn

QUEUE_LIMIT = 10_000
CLOSE_SECONDS = 30.0
_END = object()


class Tracker(Protocol):
    name: str

    def start(self) -> None: ...

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, finished: bool) -> None: ...


class BackgroundTracker:
    def __init__(self, tracker: Tracker):
        self.tracker = tracker
        self.failed = False
        self._dropped = False
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_LIMIT)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"tracker-{tracker.name}", daemon=True)
        self._thread.start()
        atexit.register(functools.partial(self.close, finished=False))  # unless closed before

    @property
    def name(self) -> str:
        return self.tracker.name

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.failed or not metrics:
            return
        try:
            self._queue.put_nowait((step, metrics))
        except queue.Full:
            if not self._dropped:
                self._dropped = True
                warn(
                    f"tracker {self.name} is {QUEUE_LIMIT:,} records behind: records are dropped there until it "
                    "catches up (metrics.jsonl has them all)"
                )

    def close(self, finished: bool = True) -> None:
        """Finish what is queued (at most CLOSE_SECONDS), then end the tracker's run, finished or
        failed; once."""
        if self._closed or self.failed:  # a failed tracker's thread has ended: nothing takes the queue
            return
        self._closed = True
        try:
            self._queue.put((_END, finished), timeout=CLOSE_SECONDS)
        except queue.Full:
            pass
        self._thread.join(CLOSE_SECONDS)
        if self._thread.is_alive() and not self.failed:
            warn(f"tracker {self.name} did not finish within {CLOSE_SECONDS:.0f} s: its last records may be missing")

    def _run(self) -> None:
        try:
            self.tracker.start()
            while (item := self._queue.get())[0] is not _END:
                self.tracker.log(*item)
            self.tracker.close(finished=item[1])
        except BaseException as exc:  # noqa: BLE001 - whatever a tracker raises, training goes on
            self.failed = True
            text = " ".join(str(exc).split()) or type(exc).__name__
            warn(
                f"tracker {self.name} stopped: {type(exc).__name__}: {text[:300]}; training goes on, "
                "its metrics are in metrics.jsonl"
            )

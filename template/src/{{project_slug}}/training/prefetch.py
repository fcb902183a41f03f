"""Input off the critical path: a background thread reads (and masks) the micro batches of the
next optimizer steps and, on CUDA, pins them, while the current step computes.

    for step, batches in prefetch.steps(load, range(start_step, max_steps), device):
        for x, y, keys in batches:     # on the device, copied from pinned memory without blocking
            ...

load(step) returns the step's micro batches as tuples of CPU tensors and must be a pure function
of the step (train.micro_batches is): the thread loads the steps in order, so the batches are
exactly those the loop would have read itself. It runs at most two steps ahead (one waiting, one
being read). An exception raised by load is raised again on the main thread, the same object, when
that step's batches are taken: a data error reads and arrives where it did without prefetching.

Leaving the loop by return (preemption) or by an exception drops the loop's iterator, its only
reference, and so closes the generator (CPython's reference counting): its finally stops and joins
the thread. The thread is a daemon as well, so nothing can hold the process open.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence

import torch

Batch = tuple[torch.Tensor, ...]


class _Failed:
    """What load raised, queued in place of the step's batches."""

    def __init__(self, error: BaseException):
        self.error = error


def steps(
    load: Callable[[int], list[Batch]], numbers: Sequence[int], device: torch.device
) -> Iterator[tuple[int, Iterator[Batch]]]:
    """(step, that step's micro batches on `device`) for each step of `numbers` (a range), read ahead."""
    ready: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    worker = threading.Thread(
        target=_read_ahead, args=(load, numbers, device, ready, stop), name="prefetch", daemon=True
    )
    worker.start()
    try:
        for step in numbers:
            yield step, _on_device(ready, step, device)
    finally:
        stop.set()
        # A put blocked on the full queue completes, then the thread sees stop: it puts at most once more.
        while True:
            try:
                ready.get_nowait()
            except queue.Empty:
                break
        worker.join()


def _read_ahead(
    load: Callable[[int], list[Batch]], numbers: Sequence[int], device: torch.device, ready: queue.Queue, stop
) -> None:
    pin = device.type == "cuda"
    try:
        if pin:
            # The CUDA device is per thread: without this, pinning would open a context on GPU 0 in every rank.
            torch.cuda.set_device(device)
        for step in numbers:
            if stop.is_set():
                return
            batches = load(step)
            if pin:  # non_blocking from pageable memory is a blocking copy
                batches = [tuple(t.pin_memory() for t in batch) for batch in batches]
            ready.put((step, batches))
    except BaseException as error:  # raised again where the main thread takes this step's batches
        ready.put(_Failed(error))


def _on_device(ready: queue.Queue, step: int, device: torch.device) -> Iterator[Batch]:
    """The step's micro batches, taken from the thread when the first one is asked for."""
    item = ready.get()
    if isinstance(item, _Failed):
        raise item.error
    loaded, batches = item
    assert loaded == step, f"prefetched step {loaded}, the loop is at {step}: a step's batches were skipped"
    for batch in batches:
        yield tuple(t.to(device, non_blocking=True) for t in batch)

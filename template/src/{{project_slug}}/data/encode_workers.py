"""Encode every unfinished part of the corpus on all cores: worker processes (spawned, so each starts
the tokenizer library's thread pool afresh) take parts in order, and the parent shows their progress.
Workers x threads = the cores this process may use, so nothing is oversubscribed.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queues
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from ..settings.config import ConfigError
from .documents import Part
from .encode_parts import EncodeSettings, encode_part, run_part, start_worker
from .progress import Progress
from .staging import finished


class WorkerDied(RuntimeError):
    """A worker ended without a result: no mistake in the input, and the finished parts are good."""


IN_PROCESS_BYTES = 8 << 20  # less input than this is encoded in this process (on all its threads)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what taskset, cgroups' cpusets and a scheduler leave us
    except AttributeError:
        return os.cpu_count() or 1


def encode_all(
    tok, parts: list[Part], settings: EncodeSettings, parts_dir: Path, tokenizer_path: Path, workers: int | None
) -> tuple[list[dict], dict]:
    """Every part's done.json in part order (finished ones read back), and how the encoding ran."""
    results = {index: finished(parts_dir, index) for index in range(len(parts))}
    todo = [index for index, done in results.items() if done is None]
    if len(todo) < len(parts):
        print(
            f"{len(parts) - len(todo)} of {len(parts)} parts were finished before: encoding the other {len(todo)}",
            flush=True,
        )
    cores = usable_cores()
    todo_bytes = sum(parts[index].size for index in todo)
    if workers is None and todo_bytes < IN_PROCESS_BYTES:
        workers = 1  # starting processes would take longer than the work
    workers = max(1, min(workers or cores, len(todo)))
    threads = max(1, cores // workers)
    progress = Progress("encoding", todo_bytes)
    try:
        if workers == 1:  # in this process, with the library's threads on every core
            for index in todo:
                results[index] = encode_part(tok, parts[index], index, settings, parts_dir, progress.update)
        else:
            results.update(_in_workers(parts, todo, settings, parts_dir, tokenizer_path, workers, threads, progress))
    finally:
        elapsed = progress.close()
    run = {"workers": workers, "threads": threads, "seconds": elapsed, "tokens": progress.tokens}
    return [results[index] for index in range(len(parts))], run


# A stop that reaches the whole process group (Ctrl-C or Ctrl-\ in a terminal, a closed terminal's
# SIGHUP, a scheduler's SIGTERM to every process of the job) is this process's to handle: it ends the
# workers itself (_stop). The helpers ignore it so that none dies first: a worker killed by it would
# read as a failed part, and multiprocessing's resource tracker (which ignores only SIGINT and SIGTERM)
# killed by SIGHUP or SIGQUIT is started again and prints a KeyError traceback per queue semaphore.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)  # what process_exit.py stops on


def _start_ignoring_stops(*args) -> None:
    """The pool's initializer: start_worker, in a worker that leaves stop signals to the parent."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    start_worker(*args)


def _start_resource_tracker() -> None:
    """multiprocessing's resource tracker started now, with the stop signals ignored: a process
    inherits ignored signals, and the tracker otherwise starts with the first queue, unguarded."""
    from multiprocessing import resource_tracker

    if threading.current_thread() is not threading.main_thread():
        resource_tracker.ensure_running()
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        resource_tracker.ensure_running()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _in_workers(parts, todo, settings, parts_dir, tokenizer_path, workers, threads, progress) -> dict[int, dict]:
    context = multiprocessing.get_context("spawn")
    _start_resource_tracker()
    reports = context.Queue()
    pool = ProcessPoolExecutor(workers, context, _start_ignoring_stops, (str(tokenizer_path), threads, reports))
    results: dict[int, dict] = {}
    try:
        futures = {pool.submit(run_part, parts[i], i, settings, str(parts_dir)): i for i in todo}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(reports, progress)
            for future in done:
                try:
                    result = future.result()
                except BrokenProcessPool:
                    raise WorkerDied(
                        f"a prepare-data worker process died (killed by the system, often for memory) while "
                        f"encoding part {futures[future]} of {len(parts)}; run the same command again to continue "
                        f"from the finished parts, with fewer --workers (now {workers}) if memory is short"
                    ) from None
                if "error" in result:
                    raise ConfigError(result["error"])
                results[futures[future]] = result
        _drain(reports, progress)
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()
    return results


def _drain(reports, progress: Progress) -> None:
    while True:
        try:
            progress.update(*reports.get_nowait())
        except queues.Empty:
            return


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the workers now (a refused input, Ctrl-C): a part can take minutes, and its folder is
    written aside, so nothing half done is ever taken for finished."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public way before Python 3.14
    for process in processes:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except (OSError, TypeError):
            pass
    # With the workers gone this waits for the pool's manager thread alone, which would otherwise close
    # its wake-up pipe while the interpreter's exit writes to it (Python 3.11: "Exception ignored in
    # ... Bad file descriptor" and a traceback after the one line).
    pool.shutdown(wait=True, cancel_futures=True)

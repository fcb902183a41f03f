"""Reading the stacks `py-spy dump --json` took of a training rank: where its main thread is (the
innermost frame of this project's code, the innermost frame) and what it waits in (a collective, the
gradient all-reduce in backward, data loading), and py-spy's text layout for the rank's file.

    from .rank_stacks import render_threads, where
    info = where(threads, pid)          # {"ours": ..., "innermost": ..., "waits_in": ..., "in_collective": ...}
    text = render_threads(process, threads, when)    # rank<R>.txt: a header, then every thread's frames

Pure functions over py-spy's JSON (and the source lines linecache finds); `debug-dump` takes the stacks.
"""

from __future__ import annotations

import linecache
import os
import re
import socket

from ..cluster.local_ranks import RankProcess

PACKAGE = __name__.partition(".")[0]
# torch.distributed (and a wrapping library's comm module) functions that block until every rank of
# the group joins.
COLLECTIVES = {
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "all_gather_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "wait",
    "allreduce",
    "allgather",
    "inference_all_reduce",
}
# C++ frames (--native) of the backends' collectives.
NATIVE_COLLECTIVE_WORDS = (
    "allreduce",
    "all_reduce",
    "allgather",
    "barrier",
    "broadcast",
    "reducescatter",
    "alltoall",
    "ncclkernel",
    "gloo::",
    "processgroupnccl",
    "processgroupgloo",
)
# A collective called from Python through a C binding (DDP's buffer broadcast before each forward:
# `dist._broadcast_coalesced(...)`) shows only as the calling line.
CALLS_COLLECTIVE = re.compile(
    r"\b(?:dist|distributed|c10d|comm)\.(_?[a-z_]*(?:broadcast|all_?reduce|all_?gather|"
    r"reduce_scatter|barrier|all_to_all)[a-z_]*)\("
)
BACKWARD = {"_engine_run_backward", "run_backward", "backward"}
# torch's loaders, and ours: the token stream, the prefetch thread, a family's own batches.
DATA_LOADING = ("torch/utils/data/", "/data/tokens.py", "/training/prefetch.py")
FAMILY_DATA = re.compile(r"/models/[^/]+/data\.py$")


def main_thread(threads: list[dict], pid: int) -> dict | None:
    """The thread that runs the training loop: on Linux its thread id is the pid."""
    for thread in threads:
        if thread.get("os_thread_id") == pid:
            return thread
    return threads[0] if threads else None


def is_ours(frame: dict, package: str = PACKAGE) -> bool:
    filename = frame.get("filename") or ""
    return f"/{package}/" in filename or (frame.get("short_filename") or "").startswith(f"{package}/")


def frame_text(frame: dict, with_source: bool = True) -> str:
    short = frame.get("short_filename") or frame.get("filename") or "?"
    text = f"{frame.get('name')} ({short}:{frame.get('line')})"
    if with_source and frame.get("filename") and frame.get("line"):
        source = linecache.getline(frame["filename"], int(frame["line"])).strip()
        if source:
            text += f"  {source}"
    return text


def where(threads: list[dict], pid: int, package: str = PACKAGE) -> dict:
    """Where the main thread is: our innermost frame, the innermost frame, and what it waits in."""
    thread = main_thread(threads, pid)
    frames = thread.get("frames", []) if thread else []  # innermost first
    ours = next((f for f in frames if is_ours(f, package)), None)
    waits_in = None
    for f in frames:
        filename = (f.get("filename") or "").replace(os.sep, "/")
        name = f.get("name") or ""
        if name in COLLECTIVES and ("torch/distributed/" in filename or "/comm/" in filename):
            waits_in = f"collective {name}"
            break
        called = CALLS_COLLECTIVE.search(linecache.getline(filename, int(f.get("line") or 0))) if filename else None
        if called:
            waits_in = f"collective {called.group(1).lstrip('_')}"
            if any((g.get("name") or "").endswith("_sync_buffers") for g in frames):
                waits_in += " (DDP syncs buffers before the forward)"
            elif "torch/nn/parallel/distributed.py" in filename:
                waits_in += " (DDP)"
            break
        if not filename.endswith(".py") and any(w in name.lower() for w in NATIVE_COLLECTIVE_WORDS):
            waits_in = f"collective ({name})"
            break
        if name in BACKWARD and ("torch/autograd/" in filename or "torch/_tensor.py" in filename):
            # DDP all-reduces the gradients from hooks during backward (a sharded strategy reduces them there too):
            # a rank that waits here waits for the gradients of the others.
            waits_in = "collective all_reduce of the gradients (in backward)"
            break
        if any(d in filename for d in DATA_LOADING) or FAMILY_DATA.search(filename):
            waits_in = "data loading"
            break
    return {
        "thread": (thread or {}).get("thread_name") or (thread or {}).get("os_thread_id"),
        "ours": frame_text(ours) if ours else None,
        "innermost": frame_text(frames[0], with_source=False) if frames else None,
        "waits_in": waits_in,
        "in_collective": bool(waits_in and waits_in.startswith("collective")),
    }


def render_threads(process: RankProcess, threads: list[dict], when: str) -> str:
    """py-spy's text layout, with a header naming the rank and how it was started."""
    lines = [
        f"rank {process.rank} (local rank {process.local_rank}, world size {process.world_size}) "
        f"pid {process.pid} on {socket.gethostname()} at {when}",
        "command: " + " ".join(process.argv),
        "",
    ]
    for thread in threads:
        state = "active" if thread.get("active") else "idle"
        name = f' "{thread["thread_name"]}"' if thread.get("thread_name") else ""
        gil = ", holds the GIL" if thread.get("owns_gil") else ""
        lines.append(f"Thread {thread.get('os_thread_id')} ({state}{gil}){name}")
        for frame in thread.get("frames", []):
            lines.append(f"    {frame_text(frame)}")
            for var in frame.get("locals") or []:
                arg = " (arg)" if var.get("arg") else ""
                lines.append(f"        {var.get('name')}{arg} = {var.get('repr')}")
        lines.append("")
    return "\n".join(lines)

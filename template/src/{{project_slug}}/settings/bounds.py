"""The range of every number a user gives, written once: the config's settings (BOUNDS) and the
command line's numbers (argparse types). A value outside its range is refused in one line that
names it and the fix, before any command computes with it: a count of 0 would otherwise be a
division by 0 in `plan` or fall back to a default in `launch`.

    bound_problems(cfg)     # [(key, message)]: rules.check_config lists them (`check`, the template's hooks)
    require_in_bounds(cfg)  # cli.py, right after loading the config: ConfigError naming every bad value
    p.add_argument("--nnodes", type=count)  # "argument --nnodes: must be a whole number of at least 1, got '0'"

Every range is finite: a count of 400 digits or a size of 1e305 would overflow the float arithmetic
of `plan` or a scheduler's field, so the largest values are bounds too (MAX_NODES, MAX_COUNT). Text
the command line passes on to a scheduler or a network has a pattern as well (job_name, host,
signal_name, scheduler_option here; a platform's own, such as a time limit in its scheduler's format,
in its folder through text_type), matched with fullmatch: `$` would let a trailing newline through.
Any other option's text (a path, a context) may not be empty or hold a control character
(text_option_problem, which cli.py applies to every command).

Platform variables (node counts, ranks, ports) are checked where they are read, by topology.py's
helpers. No torch here.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from .config import Config, ConfigError


@dataclass(frozen=True)
class Range:
    low: float
    high: float = math.inf
    low_open: bool = False
    """The low end itself is outside (a fraction above 0, a timeout longer than 0)."""
    high_open: bool = False
    high_words: str = ""
    """What the high end is in the user's terms ("a week"), said beside its number."""

    def holds(self, value: float) -> bool:
        if value == 0 and math.copysign(1.0, value) < 0 <= self.low:
            return False  # -0.0: a minus sign where none may go
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below  # NaN is neither

    def words(self) -> str:
        ends = [f"{'above' if self.low_open else 'at least'} {_number(self.low)}"]
        if self.high != math.inf:
            named = f" ({self.high_words})" if self.high_words else ""
            ends.append(f"{'below' if self.high_open else 'at most'} {_number(self.high)}{named}")
        return " and ".join(ends)


def _number(value: float) -> str:
    """The value as the user would write it; a 400-digit one named by its length, not printed whole."""
    if value == 0 and math.copysign(1.0, value) < 0:
        return "-0.0"
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer() and abs(value) < 1e16):
        return str(value)
    text = str(int(value))
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


MAX_NODES = 4096
"""Nodes of one job: more than the largest training clusters give one job."""
MAX_GPUS_PER_NODE = 16
"""GPUs of one node (8 on HGX/DGX machines; 16 on the largest)."""
MAX_COUNT = 10**12
"""Steps, tokens, batch sizes: far beyond any run, far below where float arithmetic loses whole numbers."""

# A wait longer than these is no wait a run means; far longer ones overflow what takes them
# (threading.Timer's TIMEOUT_MAX, signal.alarm's unsigned int) in a thread or a handler, where the
# overflow would end the watchdog or the stop instead of the run.
WEEK_MINUTES = 7 * 24 * 60
DAY_SECONDS = 24 * 60 * 60
TIMEOUT_MINUTES = Range(0, WEEK_MINUTES, low_open=True, high_words="a week")

COUNT = Range(1, MAX_COUNT)
NON_NEGATIVE = Range(0, MAX_COUNT)
POSITIVE = Range(0, MAX_COUNT, low_open=True)
FRACTION = Range(0, 1)
BETA = Range(0, 1, high_open=True)

BOUNDS: dict[str, Range] = {
    "cluster.nodes": Range(1, MAX_NODES),
    "cluster.gpus_per_node": Range(1, MAX_GPUS_PER_NODE),
    "cluster.max_restarts": NON_NEGATIVE,
    "cluster.stop_grace_seconds": Range(0, DAY_SECONDS, high_words="a day"),
    "model.n_kv_head": COUNT,
    "model.sequence_len": COUNT,
    "model.softcap": NON_NEGATIVE,
    "model.dropout": BETA,
    "model.attention_dropout": BETA,
    "model.qk_scale": POSITIVE,
    "model.vocab_multiple": Range(1, 4096),
    "model.rotary_base": Range(1, MAX_COUNT, low_open=True),
    "data.vocab_size": COUNT,
    "data.tokenizer_train_chars": COUNT,
    "data.val_fraction": Range(0, 1, low_open=True, high_open=True),
    "data.shard_tokens": COUNT,
    "optim.lr": NON_NEGATIVE,
    "optim.weight_decay": NON_NEGATIVE,
    "optim.beta1": BETA,
    "optim.beta2": BETA,
    "optim.eps": NON_NEGATIVE,
    "optim.grad_clip": NON_NEGATIVE,
    "optim.max_skipped_steps": NON_NEGATIVE,
    "optim.loss_spike_factor": NON_NEGATIVE,
    "optim.matrix_lr": NON_NEGATIVE,
    "optim.embedding_lr": NON_NEGATIVE,
    "optim.unembedding_lr": NON_NEGATIVE,
    "optim.scalar_lr": NON_NEGATIVE,
    "schedule.max_steps": COUNT,
    "schedule.epochs": POSITIVE,
    "schedule.tokens_per_param": POSITIVE,
    "schedule.warmup_steps": NON_NEGATIVE,
    "schedule.min_lr_ratio": FRACTION,
    "schedule.warmdown_ratio": FRACTION,
    "batch.global_batch_size": COUNT,
    "batch.micro_batch_size": COUNT,
    "batch.grad_accum_steps": COUNT,
    "checkpoint.every_steps": NON_NEGATIVE,
    "checkpoint.keep_last": COUNT,
    "logging.every_steps": COUNT,
    "logging.eval_every_steps": NON_NEGATIVE,
    "logging.eval_batches": COUNT,
    "eval.tasks_every_steps": NON_NEGATIVE,
    "eval.tasks_max_per_task": COUNT,
    # numpy seeds each rank with seed + rank, and numpy takes at most 2**32 - 1
    "run.seed": Range(0, 2**31 - 1),
    "run.collective_timeout_minutes": TIMEOUT_MINUTES,
    "run.debug_timeout_minutes": TIMEOUT_MINUTES,
    "run.start_timeout_minutes": TIMEOUT_MINUTES,
    "run.first_step_timeout_minutes": Range(0, WEEK_MINUTES, high_words="a week; 0 turns the watchdog off"),
    "parallel.tensor": COUNT,
    "parallel.pipeline": COUNT,
}


def bound_problems(cfg: Config) -> list[tuple[str, str]]:
    """(key, one-line message) for every setting outside its range; null (an optional setting's
    'derive it') is always in range."""
    defaults = Config()
    found = []
    for key, allowed in BOUNDS.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value is None or (allowed.holds(value) and math.isfinite(value)):
            continue
        default = getattr(getattr(defaults, section), name)
        example = f"{key}={_number(default)}" if default is not None and allowed.holds(default) else "null"
        found.append((key, f"{key}={_number(value)} must be {allowed.words()} (e.g. {example})"))
    return found


def require_in_bounds(cfg: Config) -> None:
    """ConfigError (one line, every bad value, keyed by the first) when a setting is out of range."""
    found = bound_problems(cfg)
    if found:
        raise ConfigError("; ".join(message for _, message in found), key=found[0][0])


# --- argparse types: the command line's numbers ---------------------------------------------------


WHOLE = re.compile(r"\s*[+-]?[0-9]+\s*")
"""ASCII digits: int() would also read Arabic-Indic or fullwidth digits, which no scheduler takes."""
COUNT_TEXT = re.compile(r"[0-9]{1,12}")


def count_in(text: str) -> int | None:
    """The count `text` holds as a scheduler's output, a batch script or a record writes it (ASCII
    digits, at most 12), else None: str.isdigit also takes other scripts' digits, which int() may
    refuse, and int() refuses more than 4300 digits."""
    return int(text) if COUNT_TEXT.fullmatch(text) else None


def whole_number(least: int, most: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type for a whole number from `least` to `most`."""

    def parse(text: str) -> int:
        value = int(text) if WHOLE.fullmatch(text) and len(text) < 40 else None
        if value is None or not least <= value <= most:
            raise argparse.ArgumentTypeError(
                f"must be a whole number of at least {least} and at most {most}, got {shown(text)}"
            )
        return value

    parse.__name__ = f"whole number {least}..{most}"
    return parse


def shown(text: str, quoted: bool = True) -> str:
    """The value as given inside a one-line message, as typed (a path's backslash or quote is not
    doubled), but a control character escaped (a pasted newline must not break the line); a 400-digit
    value is named by its length, not printed whole. Quoted unless `quoted` is false."""
    cut = text if len(text) <= 40 else text[:20]
    if CONTROL.search(cut):
        cut = repr(cut)[1:-1]
    cut = f"'{cut}'" if quoted else cut
    return cut if len(text) <= 40 else f"{cut}... ({len(text)} characters)"


count = whole_number(1)
"""Processes, tokens, iterations."""
node_count = whole_number(1, MAX_NODES)
"""Nodes of a job."""
non_negative_int = whole_number(0)
"""A rank, or a count where 0 means 'all' or 'none'."""
process_id = whole_number(1, 2**22)
"""A Linux process id (pid_max is at most 2^22)."""


def tcp_port(text: str) -> int:
    if not (WHOLE.fullmatch(text) and len(text) < 8 and 0 < int(text) < 65536):
        raise argparse.ArgumentTypeError(f"must be a TCP port (1-65535), got {shown(text)}")
    return int(text)


def _real(allowed: Range) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text) if text.isascii() else math.nan
        except ValueError:
            value = math.nan
        if not allowed.holds(value) or math.isinf(value):
            raise argparse.ArgumentTypeError(f"must be a number {allowed.words()}, got {shown(text)}")
        return value

    parse.__name__ = f"number {allowed.words()}"
    return parse


non_negative_float = _real(NON_NEGATIVE)
"""A temperature (0 = greedy)."""
positive_float = _real(POSITIVE)
"""Seconds to wait, a token count, a size."""
fraction = _real(Range(0, 1, low_open=True))
"""A share of something, above 0 and at most 1 (an assumed MFU)."""
mebibytes = _real(Range(0.01, 1024 * 1024))
"""A size of work in MiB: 10 KiB at least, so a slip of the decimal point is not a task per byte; 1 TiB at most."""


# --- text passed on to a scheduler -----------------------------------------------------------------

JOB_NAME = re.compile(r"[!-~]{1,128}")
"""A job's name on any platform: printable ASCII, no spaces (platforms add their own rules on top)."""
HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[?[0-9A-Fa-f:.]{2,45}\]?")
"""A host name, an IPv4 address or an IPv6 address (bracketed or not)."""
SIGNAL = re.compile(r"(SIG)?[A-Za-z][A-Za-z0-9+]{1,9}|[0-9]{1,2}")
"""A signal as a scheduler's cancel command takes it: USR1, SIGTERM, RTMIN+1 or its number."""
SCHEDULER_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*(=[^\x00-\x1f\x7f]*)?")
"""One option for a scheduler's command line, written with '=' (--nodes=4, --exclusive)."""


def text_type(pattern: re.Pattern, words: str) -> Callable[[str], str]:
    """An argparse type taking text that `pattern` matches whole; `words` say what it must be."""

    def parse(text: str) -> str:
        if not pattern.fullmatch(text):
            raise argparse.ArgumentTypeError(f"must be {words}, got {shown(text)}")
        return text

    parse.__name__ = words
    parse.pattern = pattern  # what tells a pattern's type from a number's
    return parse


job_name = text_type(JOB_NAME, "1 to 128 printable ASCII characters without spaces, e.g. run-2")
host = text_type(HOST, "a host name or IP address, e.g. node-0 or 10.0.0.1")
signal_name = text_type(SIGNAL, "a signal name or number, e.g. USR1 or TERM")
scheduler_option = text_type(SCHEDULER_OPTION, "one option written with '=', e.g. --nodes=4 or --exclusive")


# --- text of any other form ------------------------------------------------------------------------

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ANY_TEXT = "any_text"
"""Set on an argparse action (`action.any_text = True`) whose value may be empty or hold newlines
(a prompt); every other option's text is refused empty or with a control character."""


def text_option_problem(option: str, value: str) -> str | None:
    """Why a value of an option without a type of its own cannot be what the user meant, or None: an
    empty value (`--config=` used to mean the default) or a control character (a pasted newline)."""
    if not value.strip():
        return f"{option} is empty; give a value or leave {option} out"
    bad = CONTROL.search(value)
    if bad:
        return f"{option} {shown(value)} holds the control character {bad.group()!r}; retype it"
    return None

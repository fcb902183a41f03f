"""Command-line interface: one module per subcommand, wired here.

    <package> <command> [options] [section.key=value ...]
    <package> --help | <package> <command> --help

Every command reads config/train.yaml (or --config) and accepts overrides as `section.key=value`
arguments or `--set section.key=value`. A user mistake prints one message and exits 1 (unrecoverable.py).

A command's module has `add_arguments(parser)` and `run(cfg, args) -> int`. Only the module of the
command being run is imported, so torch-free commands (check, plan, image, launch, debug-dump) start
without importing torch.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import NoReturn

from .launch import platform_commands
from .runtime import process_exit, unrecoverable
from .runtime.output_paths import own_paths, require_writable_outputs
from .runtime.process_exit import end
from .settings.bounds import ANY_TEXT, require_in_bounds, text_option_problem
from .settings.config import ConfigError, add_config_arguments, load_config
from .training.preemption import follow_launcher

# command: (module, one-line help), in the order a project uses them
COMMANDS = {
    "prepare-data": ("data.prepare_data", "tokenizer + packed token shards from local files"),
    "check": ("planning.check", "validate the config for the project's world size"),
    "plan": ("planning.plan", "memory per GPU, whether it fits, and time to train for 1-8 nodes"),
    "train": ("training.train", "train (run under torchrun for several processes)"),
    "eval": ("evaluation.evaluate", "validation loss and bits per byte of a checkpoint"),
    "sample": ("evaluation.sample", "generate text from a checkpoint"),
    "export": ("evaluation.export", "a checkpoint as a folder transformers loads (weights, config, tokenizer)"),
    "image": ("image.build", "build and push the project image (docker SDK, DOCKER_HOST)"),
    "launch": ("launch", "submit to a platform, or its job's status, logs, cancel (launch/<platform>/)"),
    "node": ("cluster.node", "node launcher run by the platform on each node: topology -> torchrun"),
    **platform_commands(),  # a platform folder's own (launch/<platform>/__init__.py's COMMANDS)
    "doctor": ("diagnostics.doctor", "check this node: GPUs, RDMA, /dev/shm, memlock, which transport NCCL uses"),
    "debug-dump": (
        "diagnostics.debug_dump",
        "Python stacks of every training rank on this machine (py-spy), for a hung job",
    ),
}


class OneLineParser(argparse.ArgumentParser):
    """A usage mistake is one line too (exit 2, argparse's code); `--help` shows the usage."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see `{self.prog} --help`)\n")


def command_module(command: str) -> ModuleType:
    return importlib.import_module(f".{COMMANDS[command][0]}", __package__)


def build_parser(commands=None) -> argparse.ArgumentParser:
    """The parser listing every command; the options of `commands` (default: all) are added."""
    parser = OneLineParser(prog=__package__, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")
    for name, (_, summary) in COMMANDS.items():
        p = sub.add_parser(name, help=summary, description=summary)
        if commands is None or name in commands:
            command_module(name).add_arguments(p)
            if p._subparsers is None:  # a command with subcommands (launch) gives each of them the config options
                add_config_arguments(p)
    return parser


def requested_command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first argument that is not an option)."""
    return next((a for a in argv if not a.startswith("-")), None)


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse options; bare KEY=VALUE arguments, wherever they stand, join args.overrides. (An argparse
    positional could not follow the options of a subcommand.)"""
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("-") or "=" not in a]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (config overrides look like section.key=value)")
    args.overrides += extra
    problem = next(text_problems(parser, args), None)
    if problem:
        command_parser, message = problem
        command_parser.error(message)
    return args


def text_problems(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Iterator[tuple]:
    """Options without a type of their own (paths, names, addresses) given as empty text or with a
    control character, in the parsers `args` went through: one check for every command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None))
            if chosen is not None:
                yield from text_problems(chosen, args)
        elif action.option_strings and action.type is None and action.nargs != 0 and not action.choices:
            if getattr(action, ANY_TEXT, False) or action.dest == "overrides":  # overrides: the config checks them
                continue
            value = getattr(args, action.dest, None)
            for text in value if isinstance(value, list) else [value]:
                if isinstance(text, str) and text is not action.default:
                    problem = text_option_problem(action.option_strings[-1], text)
                    if problem:
                        yield parser, problem


# torchao (run.fp8; transformers imports it too wherever it is installed) logs each CUDA extension a
# CPU torch cannot load, and torch a deprecation of how torchao registers its types: noise in every
# command's output, not the user's to act on.
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    command = requested_command(argv)
    if command is not None and command not in COMMANDS:
        close = difflib.get_close_matches(command, COMMANDS, n=1)
        hint = f"did you mean `{close[0]}`? " if close else ""
        print(f"error: no command {command!r}; {hint}the commands are {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if command == "train":
        follow_launcher(os.environ)  # a rank ends with the launcher that started it
    else:
        process_exit.stop_like_ctrl_c()  # train: SIGTERM saves a checkpoint instead (preemption.py)
    args = parse_with_overrides(build_parser([command] if command in COMMANDS else ()), argv)
    cfg = None
    try:
        cfg = load_config(args.config, args.overrides)
        require_in_bounds(cfg)  # before any command computes with a count of 0
        require_writable_outputs(cfg, args.command, args)
        return command_module(args.command).run(cfg, args)
    except ConfigError as exc:
        # One line; in a rank under the node supervisor, handed to it instead (unrecoverable.py)
        return unrecoverable.report(exc)
    except BrokenPipeError:  # the reader of the output left (`| head`): nothing more to say, to anyone
        return process_exit.reader_gone()
    except Exception as exc:
        failure = None
        if isinstance(exc, OSError):
            failure = unrecoverable.path_mistake(exc) or (
                unrecoverable.unwritable(exc, own_paths(cfg)) if cfg else None
            )
        if failure is not None:
            return unrecoverable.report(failure)
        if unrecoverable.recorded_by_a_rank():
            return 0  # a peer's echo (its collective lost the rank that failed): the job ends for that failure
        raise  # a crash a restart may outlive: torchrun's to handle
    except (
        KeyboardInterrupt
    ) as exc:  # Ctrl-C, SIGTERM or SIGHUP where no command handles it: what it kept was said above
        print(f"{args.command}: {process_exit.how(exc)}", file=sys.stderr)
        return process_exit.interrupted_code(exc)


def entry() -> NoReturn:
    """The console script and `python -m <package>`: main's exit code, and the end of a process
    that trained or evaluated in a process group without finalization (runtime/process_exit.py)."""
    try:
        code = main()
    except BaseException as exc:  # a crash torchrun restarts from: the traceback, and exit 1
        if not process_exit.in_group():
            raise
        process_exit.crash(exc)
    end(code)

"""Generated bad values for every config key and every validated command-line option: each ends in
exit 1 or 2 with one `error:` line naming the input, no traceback, and nothing written.

    python -m pytest -q tests/test_bad_values.py     # a few seconds: the cases run in one process

The cases run in-process (cli.main) in one child process, so hundreds of them cost one start-up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import typing

from conftest import parts_held, platforms_read
from test_bad_input import PLATFORM_NAMES, PLATFORM_PREFIXES

WRONG_NUMBERS = ["abc", "", "1" + "0" * 400, "1e305", "inf", "nan", "\uff11\uff12", "1\n2"]
DRIVER = """
import contextlib, io, json, os, sys, traceback
from PACKAGE import cli
base = dict(os.environ)
results = []
for argv, env in json.load(open(sys.argv[1])):
    os.environ.clear()
    os.environ.update(dict(base, **env))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            code, _ = None, traceback.print_exc()
    results.append([argv, code, out.getvalue() + err.getvalue()])
json.dump(results, sys.stdout)
"""


def run_cases(cli, tmp_path, cases: list, check_written: bool = True, env: dict | None = None) -> list:
    """[argv, exit code, output] of each case, run in one process; a case is argv, or (argv, the
    variables it adds to the environment). env: the variables to add (None removes one) for all."""
    before = sorted(p for p in cli.root.rglob("*") if "__pycache__" not in p.parts)
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps([case if isinstance(case, tuple) else (case, {}) for case in cases]))
    driver = DRIVER.replace("PACKAGE", cli.package)
    results = json.loads(cli.run([sys.executable, "-c", driver, cases_file], timeout=600, env=env).stdout)
    if check_written:
        assert sorted(p for p in cli.root.rglob("*") if "__pycache__" not in p.parts) == before, "a case wrote a file"
    return results


def refused_cleanly(result, named: str) -> str:
    """'' when the case ended as it should; else what went wrong."""
    argv, code, output = result
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    if code not in (1, 2) or "Traceback" in output or len(errors) != 1 or named not in errors[0]:
        return f"{argv!r}: exit {code}\n{output[-1500:]}"
    return ""


def config_cases(pkg) -> list[tuple[list[str], str]]:
    config = pkg.module("settings.config")
    bounds = pkg.module("settings.bounds")
    cases = []
    for section in dataclasses.fields(config.Config):
        kind = type(getattr(config.Config(), section.name))
        hints = typing.get_type_hints(kind)
        for field in dataclasses.fields(kind):
            key, hint = f"{section.name}.{field.name}", hints[field.name]
            base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
            values = []
            if base is int:
                values = ["abc", "1.5", "\uff11\uff12", "1e305", "1_0"]  # int() reads 1_0 as 10
            elif base is float:
                values = ["abc", "\uff11\uff12", "1_0.5"]  # float() alone would read full-width digits, and 10.5
            elif base is bool:
                values = ["maybe", "2"]
            if key in bounds.BOUNDS:
                allowed = bounds.BOUNDS[key]
                values += ["1" + "0" * 400, "-1" if allowed.low >= 0 else "abc"]
                values += ["-0.0"] if base is float and allowed.low >= 0 else []  # a minus sign, not a zero
                values += ["0"] if not allowed.holds(0) else []
                values += ["inf", "nan", "1e305"] if base is float else []
            cases += [(["check", f"{key}={value}"], key) for value in dict.fromkeys(values)]
    return cases


def every_option(pkg):
    """(command words, argparse action, whether a bounds.py type checks it) for every option of every
    command, launch's platforms included (a platform's own text patterns are bounds.text_type's)."""
    cli, bounds = pkg.module("cli"), pkg.module("settings.bounds")
    checked = {getattr(bounds, name) for name in dir(bounds) if callable(getattr(bounds, name))}

    def walk(parser, prefix):
        for action in parser._actions:
            if action.choices and isinstance(action.choices, dict):  # subcommands
                for name, sub in action.choices.items():
                    yield from walk(sub, [*prefix, name])
            elif action.option_strings and action.nargs != 0:
                yield prefix, action, action.type in checked or hasattr(action.type, "pattern")

    return walk(cli.build_parser(), [])


FREE_TEXT = ["", "x\n", "\u00e9", "a b", "9" * 400]


def option_cases(pkg) -> list[tuple[list[str], str]]:
    """Every option whose argparse type checks a number or a pattern, with values no such type may
    accept."""
    cases = []
    for prefix, action, checked in every_option(pkg):
        if checked:
            values = FREE_TEXT if hasattr(action.type, "pattern") else WRONG_NUMBERS + ["-1"]
            option = action.option_strings[-1]
            cases.extend(([*prefix, f"{option}={value}"], option) for value in values)
    return cases


def test_every_config_key_and_option_refuses_bad_values_in_one_line(cli, pkg, tmp_path):
    cases = config_cases(pkg) + option_cases(pkg)
    assert len(cases) > 300  # every key and option took part
    results = run_cases(cli, tmp_path, [argv for argv, _ in cases])
    failures = [f for result, (_, named) in zip(results, cases) if (f := refused_cleanly(result, named))]
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:10])


def test_a_path_the_system_cannot_look_up_and_a_ray_address_of_another_form_are_one_line(cli, tmp_path):
    """Free-text options: a path too long for the system or through a loop of links, in any command
    that takes one, and a Ray address that is no address."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    too_long = "9" * 400
    cases = [
        (["check", f"--config={too_long}"], "cannot use the path"),
        (["plan", f"--config={loop / 'train.yaml'}"], str(loop)),  # named as not found
        (["eval", f"--checkpoint={too_long}"], "cannot use the path"),
        (["sample", f"--checkpoint={loop / 'step_00000010.pt'}"], str(loop)),
        (["doctor", f"--nccl-log={too_long}"], "cannot use the path"),
        (["ray-train", "--address=not an address"], "ray"),
    ]
    results = run_cases(cli, tmp_path, [argv for argv, _ in cases])
    failures = [f for result, (_, named) in zip(results, cases) if (f := refused_cleanly(result, named))]
    assert not failures, "\n".join(failures)


VERDICT = re.compile(r"^doctor: (ok|warn|FAIL) - ", re.M)  # doctor ran and judged this machine


def free_text_cases(pkg) -> list[list[str]]:
    """Every option that takes text of any form (a path, a prompt, an address, a kubeconfig context:
    no checking type) with text no user means. Launches are dry runs."""
    cases = []
    for prefix, action, checked in every_option(pkg):
        if not checked and not action.choices:
            dry = ["--dry-run"] if prefix[0] == "launch" else []
            cases.extend([*prefix, f"{action.option_strings[-1]}={value}", *dry] for value in FREE_TEXT)
    return cases


def test_every_free_text_option_ends_in_one_line_or_is_used(cli, pkg, tmp_path):
    """Text of any form in an option without a type ends as a refusal (exit 1 or 2, one `error:` line,
    no traceback) or is used as given (exit 0, or doctor's verdict on this machine). Empty text and
    control characters are refused everywhere but in a prompt; nothing is written in the project but
    a folder the case named (doctor --log-dir=a b)."""
    cases = free_text_cases(pkg)
    assert len(cases) > 200  # every command's options took part (fewer in a project of fewer platforms)
    before = set(cli.root.rglob("*"))
    results = run_cases(cli, tmp_path, cases, check_written=False)
    failures, named_folders = [], set()
    for argv, code, output in results:
        value = argv[-2 if argv[-1] == "--dry-run" else -1].partition("=")[2]
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        refused = code in (1, 2) and len(errors) == 1
        used = code == 0 or (argv[0] == "doctor" and code == 1 and VERDICT.search(output) and not errors)
        prompt = argv[:2] == ["sample", f"--prompt={value}"]
        if (
            "Traceback" in output
            or not (refused or used)
            or (used and not prompt and (not value.strip() or "\n" in value))
        ):
            failures.append(f"{argv!r}: exit {code}\n{output[-1500:]}")
        elif used:
            named_folders.add(cli.root / value)
    written = {p for p in set(cli.root.rglob("*")) - before if "__pycache__" not in p.parts}
    for path in sorted(written, reverse=True):
        if not any(path == folder or folder in path.parents for folder in named_folders):
            failures.append(f"a case wrote {path}")
    for folder in named_folders & written:
        shutil.rmtree(folder)
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:10])


# Each platform's variables as `node` reads them (a job of 2 nodes, this one node 0); the addresses
# and the node list are text, every other one a number.
PLATFORM_VARIABLES = {
    "tione-ddp": {"WORLD_SIZE": "2", "RANK": "0", "INDEX": "0", "GPU_NUM_PER_NODE": "1", "GPU_NUM": "2"}
    | {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
    "kubeflow": {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "1", "PET_MAX_RESTARTS": "3"}
    | {"PET_MASTER_ADDR": "job-master-0", "PET_MASTER_PORT": "23456"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}
    | {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
    "slurm": {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_GPUS_ON_NODE": "1"}
    | {"SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": "node1,node2"},
    "tione-ray": {"HEAD_ADDR": "10.0.0.1", "HEAD_PORT": "6379", "RANK": "0", "WORLD_SIZE": "2"},
}
# Those of the platforms this project holds (mpirun's are every project's).
PLATFORM_VARIABLES = {
    name: variables for name, variables in PLATFORM_VARIABLES.items() if set(platforms_read(variables)) <= parts_held()
}
TEXT_VARIABLES = {"MASTER_ADDR", "PET_MASTER_ADDR", "HEAD_ADDR", "SLURM_JOB_NODELIST"}
WRONG_COUNTS = ["abc", "-1", "1.5", "1" + "0" * 400, "\uff11\uff12", "1\n2", "10000000000000"]


def test_every_platform_variable_refuses_bad_values_in_one_line(cli, tmp_path):
    """Each number a platform injects, of each platform `node` reads, given text, a negative, a
    fraction, 400 digits, other scripts' digits, a newline or a count no cluster has: `node --dry-run`
    ends with exit 1 and one `error:` line naming the variable, before any torchrun command."""
    runner = {k: None for k in os.environ if k.startswith(PLATFORM_PREFIXES) or k in PLATFORM_NAMES}
    runner["OMPI_MCA_orte_default_hostfile"] = None
    cases = [(["node", "--dry-run"], variables) for variables in PLATFORM_VARIABLES.values()]  # as given: they pass
    named = [None] * len(cases)
    for variables in PLATFORM_VARIABLES.values():
        for name in set(variables) - TEXT_VARIABLES:
            cases += [(["node", "--dry-run"], {**variables, name: value}) for value in WRONG_COUNTS]
            named += [name] * len(WRONG_COUNTS)
    failures = []
    for (argv, code, output), name, (_, env) in zip(run_cases(cli, tmp_path, cases, env=runner), named, cases):
        if name is None:
            if code != 0 or "Traceback" in output:
                failures.append(f"{env}: exit {code} though every variable is good\n{output[-1500:]}")
        elif refused_cleanly([argv, code, output], name) or "$ " in output:
            failures.append(f"{name}={env[name]!r}: exit {code}\n{output[-1500:]}")
    assert len(cases) > 20 * len(PLATFORM_VARIABLES)  # each platform: its numbers, each given seven wrong ways
    assert not failures, f"{len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:10])

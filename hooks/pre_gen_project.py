"""cookiecutter pre_gen hook: check the answers with the template's rules before anything is rendered.

cookiecutter renders this file with Jinja (the context is read from it below), then runs it inside
the new project folder. On a bad answer it prints one line per problem, starting with the field
("field: why" or "field=value: why"), and exits 1; cookiecutter then deletes the project folder it
created. On success it writes the answers, typed the way
copier.yml asks for them, to .cookiecutter-answers.json for post_gen_project.py.

Checks, in order, all from the one set of rules:
  1. names: a key=value on the command line that no question has (`node=4` for `nodes`);
     cookiecutter drops those before this hook runs, so they are read back from its command line;
  2. types: integer questions hold whole numbers, choices hold one of theirs, platforms is a
     comma-separated list (hooks/answers.py given_problems: copier's wording);
  3. copier's own per-question validators (copier.yml), by a copier run with pretend=True
     (nothing written);
  4. hooks/answers.py problems(): cross-field rules of the generated package (rules.py, plan.py).
Run: cookiecutter /path/to/template   (see README.md, "cookiecutter")
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

CONTEXT = json.loads(r"""{{ cookiecutter | tojson }}""")
ANSWERS_FILE = ".cookiecutter-answers.json"


def template_root() -> Path:
    """The template checkout cookiecutter read (its _repo_dir may be relative to the caller's cwd)."""
    given = Path(CONTEXT["_repo_dir"])
    candidates = [given] if given.is_absolute() else [Path(os.environ.get("PWD", "")) / given, given]
    for path in candidates:
        if (path / "copier.yml").is_file() and (path / "cookiecutter.json").is_file():
            return path.resolve()
    sys.exit(
        f"template: cannot find copier.yml next to cookiecutter.json in {given}; "
        "run cookiecutter with the template's absolute path"
    )


def answers_module(root: Path):
    """hooks/answers.py of the template cookiecutter read: the questions and the rules."""
    spec = importlib.util.spec_from_file_location("dtt_hooks_answers", root / "hooks" / "answers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def command_line_answers() -> dict[str, str]:
    """The key=value answers of the cookiecutter command that runs this hook. cookiecutter drops a key
    cookiecutter.json lacks before any hook runs, so a typo such as node=4 would pass unseen: the
    command line is read back from the parent process (Linux /proc; elsewhere, and under cookiecutter's
    Python API, nothing is read and such keys stay unchecked)."""
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
        start = next(i for i, arg in enumerate(argv) if Path(arg).name == "cookiecutter")
        from cookiecutter.cli import main as cookiecutter_cli

        parsed = cookiecutter_cli.make_context("cookiecutter", argv[start + 1 :], resilient_parsing=True)
    except Exception:  # noqa: BLE001 - not a cookiecutter command line: nothing to check
        return {}
    given = parsed.params.get("extra_context") or {}
    if isinstance(given, dict):  # cookiecutter's own callback has split key=value already
        return {str(key): value for key, value in given.items()}
    return dict(pair.split("=", 1) for pair in given if "=" in pair)


def typed_answers(root: Path, rules) -> tuple[dict, list[str]]:
    """cookiecutter's string answers as copier takes them: ints as ints, platforms as a list."""
    import yaml

    spec = yaml.safe_load((root / "copier.yml").read_text())
    answers, problems = {}, []
    for key, value in CONTEXT.items():
        question = spec.get(key)
        if key.startswith("_") or not isinstance(question, dict):
            continue
        if question.get("multiselect"):
            items = [p.strip(" '\"") for p in str(value).strip().strip("[]").split(",") if p.strip(" '\"")]
            allowed = [str(v) for v in rules.question_choices(key)]
            wrong = [p for p in items if p not in allowed]
            if wrong or not items:
                problems.append(
                    f"{key}: '{value}' must be a comma-separated list of {', '.join(allowed)}, "
                    f"e.g. {key}=devmachine,slurm"
                )
            value = items
        else:
            wrong = rules.given_problems({key: value})
            problems += [f"{field}: {message}" for field, message in wrong]
            if question.get("type") == "int" and not wrong:
                value = int(str(value).strip())
        answers[key] = value
    return answers, problems


def copier_validators(root: Path, answers: dict) -> list[str]:
    """copier.yml's validators for these answers; copier runs with pretend=True, so nothing is written."""
    import copier
    from copier.errors import DirtyLocalWarning

    warnings.simplefilter("ignore", DirtyLocalWarning)  # the real run (post_gen) still says it
    with tempfile.TemporaryDirectory() as tmp:
        try:
            copier.run_copy(
                src_path=str(root),
                dst_path=str(Path(tmp) / "p"),
                data=answers,
                defaults=True,
                unsafe=True,
                vcs_ref="HEAD",
                pretend=True,
                quiet=True,
            )
        except ValueError as exc:
            found = re.match(r"Validation error for question '(\w+)': (.*)", str(exc), re.S)
            return [f"{found[1]}: {' '.join(found[2].split())}" if found else f"answers: {exc}"]
    return []


def main() -> int:
    root = template_root()
    rules = answers_module(root)
    unknown = {key: value for key, value in command_line_answers().items() if key not in CONTEXT}
    problems = [f"{field}: {message}" for field, message in rules.given_problems(unknown)]
    if not problems:
        answers, problems = typed_answers(root, rules)
    if not problems:
        problems = copier_validators(root, answers)
    if not problems:  # cross-field rules (rules.py, plan.py): lines "<field>=<value>: <why>; <what to do>"
        problems = rules.problems(answers)
    if problems:
        print("cookiecutter: the answers are not accepted, nothing was written:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    Path(ANSWERS_FILE).write_text(json.dumps({"template": str(root), "answers": answers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

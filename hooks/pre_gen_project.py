"""cookiecutter pre_gen hook: check the answers with the template's rules before anything is rendered.

cookiecutter renders this file with Jinja (the context is read from it below), then runs it inside
the new project folder. On a bad answer it prints one line per problem, starting with the field
("field: why" or "field=value: why"), and exits 1; cookiecutter then deletes the project folder it
created. On success it writes the answers, typed the way
copier.yml asks for them, to .cookiecutter-answers.json for post_gen_project.py.

Checks, in order, all from the one set of rules:
  1. types: integer questions hold integers, platforms is a comma-separated list;
  2. copier's own per-question validators (copier.yml), by a copier run with pretend=True
     (nothing written);
  3. hooks/answers.py problems(): cross-field rules of the generated package (rules.py, plan.py).
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


def typed_answers(root: Path) -> tuple[dict, list[str]]:
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
            allowed = [str(v) for v in (question.get("choices") or {}).values()]
            wrong = [p for p in items if p not in allowed]
            if wrong or not items:
                problems.append(
                    f"{key}: '{value}' must be a comma-separated list of {', '.join(allowed)}, "
                    f"e.g. {key}=devmachine,slurm"
                )
            value = items
        elif question.get("type") == "int":
            try:
                value = int(str(value).strip())
            except ValueError:
                problems.append(f"{key}: '{value}' is not a whole number")
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


def shared_rules(root: Path, answers: dict) -> list[str]:
    """Cross-field problems from hooks/answers.py (the generated package's rules.py and plan.py)."""
    spec = importlib.util.spec_from_file_location("dtt_hooks_answers", root / "hooks" / "answers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.problems(answers)  # lines "<field>=<value>: <why>; <what to do>"


def main() -> int:
    root = template_root()
    answers, problems = typed_answers(root)
    if not problems:
        problems = copier_validators(root, answers)
    if not problems:
        problems = shared_rules(root, answers)
    if problems:
        print("cookiecutter: the answers are not accepted, nothing was written:", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    Path(ANSWERS_FILE).write_text(json.dumps({"template": str(root), "answers": answers}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

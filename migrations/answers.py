"""Answer migrations that `copier update` runs in a generated project (copier.yml `_migrations`).

Run by copier in the project's root on every update, before it renders anything, so the new
template reads the migrated answers. Every command does nothing where it does not apply (the answer
is recorded already, a condition does not hold), so a second run changes nothing; each takes its
arguments as a list (no shell, so no quoting issues).

    python migrations/answers.py rename OLD NEW
        the answer OLD becomes NEW (value kept), unless NEW is already recorded
    python migrations/answers.py adopt ANSWER SECTION.KEY [--if NAME=VALUE] [--unless NAME]
        record ANSWER from config/train.yaml's SECTION.KEY when the answers file lacks it
        (an answer that used to live only in the config file), optionally only when another
        answer has a given value, or only when another answer is not recorded (a question asked
        at the same time, which tells a project made since from one made before)
    python migrations/answers.py keep ANSWER VALUE [--if NAME=VALUE] [--unless NAME]
        record ANSWER=VALUE when the answers file lacks it: a new question whose default would change
        what an existing project does keeps the project where it was
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ANSWERS = Path(".copier-answers.yml")
CONFIG = Path("config/train.yaml")


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    return data if isinstance(data, dict) else {}


def _save(answers: dict) -> None:
    # The answers file opens with copier's "do not edit" comment; keep it.
    header = (
        "".join(line for line in ANSWERS.read_text().splitlines(keepends=True) if line.startswith("#"))
        if ANSWERS.is_file()
        else ""
    )
    ANSWERS.write_text(header + yaml.safe_dump(answers, sort_keys=False, allow_unicode=False))


def rename(old: str, new: str) -> str:
    answers = _load(ANSWERS)
    if old not in answers:
        return f"answer {old!r} not recorded: nothing to rename"
    value = answers.pop(old)
    if new in answers:
        _save(answers)
        return f"answer {new!r} already recorded; dropped the old {old!r}"
    answers[new] = value
    _save(answers)
    return f"answer {old!r} renamed to {new!r} (value {value!r})"


def _not_applying(answers: dict, answer: str, condition: str | None, unless: str | None = None) -> str | None:
    """Why ANSWER is left alone: already recorded, the condition NAME=VALUE does not hold, or the
    answer UNLESS is recorded (the project was made when ANSWER was asked, and it was not asked)."""
    if answer in answers:
        return f"answer {answer!r} already recorded"
    if unless and unless in answers:
        return f"answer {answer!r} does not apply ({unless} is recorded)"
    if condition:
        name, _, value = condition.partition("=")
        if str(answers.get(name)) != value:
            return f"answer {answer!r} does not apply ({name} is {answers.get(name)!r})"
    return None


def keep(answer: str, value: str, condition: str | None, unless: str | None = None) -> str:
    answers = _load(ANSWERS)
    if why := _not_applying(answers, answer, condition, unless):
        return why
    answers[answer] = value
    _save(answers)
    return f"answer {answer!r} = {value!r}: the project keeps what it had before the question was asked"


def adopt(answer: str, dotted: str, condition: str | None, unless: str | None = None) -> str:
    answers = _load(ANSWERS)
    if why := _not_applying(answers, answer, condition, unless):
        return why
    node = _load(CONFIG)
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return f"{CONFIG} has no {dotted}: {answer!r} keeps the template's default"
        node = node[part]
    answers[answer] = node
    _save(answers)
    return f"answer {answer!r} = {node!r}, taken from {CONFIG} {dotted}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_rename = sub.add_parser("rename")
    p_rename.add_argument("old")
    p_rename.add_argument("new")
    p_adopt = sub.add_parser("adopt")
    p_adopt.add_argument("answer")
    p_adopt.add_argument("dotted")
    p_adopt.add_argument("--if", dest="condition")
    p_adopt.add_argument("--unless")
    p_keep = sub.add_parser("keep")
    p_keep.add_argument("answer")
    p_keep.add_argument("value")
    p_keep.add_argument("--if", dest="condition")
    p_keep.add_argument("--unless")
    args = parser.parse_args(argv)
    if not ANSWERS.is_file():
        print(
            f"migration: {ANSWERS} not found in {Path.cwd()}; run copier update from the project root", file=sys.stderr
        )
        return 1
    if args.command == "rename":
        message = rename(args.old, args.new)
    elif args.command == "keep":
        message = keep(args.answer, args.value, args.condition, args.unless)
    else:
        message = adopt(args.answer, args.dotted, args.condition, args.unless)
    print(f"migration: {message}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

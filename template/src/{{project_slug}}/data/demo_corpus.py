"""A small English corpus made from text already on every machine: the docstrings of Python's
standard library (about 1 MB). It stands in for real data in the CPU demo and the tests, so
nothing is downloaded. Parsed with `ast`, never imported, so no module runs.
"""

from __future__ import annotations

import ast
import json
import sysconfig
from pathlib import Path

_SKIP = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3"}


def stdlib_docstrings(min_chars: int = 100) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    docs.append(doc)
    return docs


def write_demo_corpus(raw_dir: Path) -> Path:
    """Write the corpus as jsonl with a "text" field, the format prepare-data reads."""
    raw_dir.mkdir(parents=True, exist_ok=True)
    out = raw_dir / "stdlib_docstrings.jsonl"
    tmp = out.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for doc in stdlib_docstrings():
            f.write(json.dumps({"text": doc}) + "\n")
    tmp.replace(out)
    return out

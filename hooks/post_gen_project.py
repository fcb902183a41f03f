"""cookiecutter post_gen hook: render template/ into the new project folder with copier.

cookiecutter has created only an empty project folder (plus the placeholder file); this hook
removes the placeholder and runs copier's Python API with the answers pre_gen_project.py checked
and typed, so the project is byte-for-byte what `copier copy --trust --defaults --vcs-ref=HEAD`
makes with the same answers, .copier-answers.yml included (later `copier update` works).
vcs_ref HEAD: the template checkout cookiecutter read, uncommitted changes included.
A failure (copier's post-generation check) exits 1 and cookiecutter deletes the folder.
Run: cookiecutter /path/to/template   (see README.md, "cookiecutter")
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ANSWERS_FILE = Path(".cookiecutter-answers.json")
PLACEHOLDER = Path(".cookiecutter-placeholder")


def main() -> int:
    import copier

    if not ANSWERS_FILE.is_file():
        print("cookiecutter: pre_gen_project.py did not run (hooks disabled?); nothing rendered", file=sys.stderr)
        return 1
    checked = json.loads(ANSWERS_FILE.read_text())
    ANSWERS_FILE.unlink()
    PLACEHOLDER.unlink(missing_ok=True)
    try:
        copier.run_copy(
            src_path=checked["template"],
            dst_path=str(Path.cwd()),
            data=checked["answers"],
            defaults=True,
            unsafe=True,
            vcs_ref="HEAD",
        )
    except Exception as exc:  # noqa: BLE001 - copier's message is the user's answer; no traceback
        print(f"cookiecutter: copier could not render the project: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

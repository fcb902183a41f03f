"""cookiecutter front end: `cookiecutter <template>` builds the same project as `copier copy`.

cookiecutter.json is derived from copier.yml by `derive_cookiecutter_json()` below (same questions,
same defaults, copier's Jinja defaults rewritten to cookiecutter's `cookiecutter.<name>` context).
After editing copier.yml, regenerate it:  python tests/test_cookiecutter.py --write

Run:  .venv/bin/pytest tests/test_cookiecutter.py -q
Real runs only: the cookiecutter and copier CLIs render into temporary folders and the trees are
compared file by file (bytes and executable bits).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import BIN, TEMPLATE, copier_copy, run  # noqa: E402

sys.path.insert(0, str(TEMPLATE / "hooks"))
import answers  # noqa: E402

COOKIECUTTER_JSON = TEMPLATE / "cookiecutter.json"
# Private (not asked, not passed to copier) tables that derived defaults look things up in.
PRIVATE_TABLES: dict[str, str] = {}  # none today: the defaults ask the family's descriptor (family_default)
JINJA_BLOCK = re.compile(r"({{.*?}}|{%.*?%})", re.S)
TOKEN = re.compile(r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\.?[A-Za-z_][A-Za-z0-9_]*)""")


def _translate(expr: str, names: set[str]) -> str:
    """Rewrite copier's bare question names in Jinja blocks to cookiecutter's context names."""

    def block(match: re.Match) -> str:
        def token(t: re.Match) -> str:
            word = t.group(0)
            if word[0] in "'\".":  # string literal or attribute: leave alone
                return word
            if word in PRIVATE_TABLES:
                return f"cookiecutter.{PRIVATE_TABLES[word]}"
            return f"cookiecutter.{word}" if word in names else word

        return TOKEN.sub(token, match.group(0))

    return JINJA_BLOCK.sub(block, expr)


def derive_cookiecutter_json(copier_yml: Path = TEMPLATE / "copier.yml") -> dict:
    """cookiecutter.json's content from copier.yml: every asked question with copier's default.

    Representation: every answer is a plain string variable (no cookiecutter choice lists, so a
    wrong choice reaches the pre_gen hook and gets copier's message instead of a traceback);
    the multiselect `platforms` is a comma-separated string. Questions with `when: false` are
    derived by copier and not asked (a table one of them held would be kept as a private `_<name>`).
    """
    spec = yaml.safe_load(copier_yml.read_text())
    questions = {k: v for k, v in spec.items() if not k.startswith("_")}
    asked = [k for k, v in questions.items() if v.get("when") is not False]
    names = set(asked)
    # Private tables first: cookiecutter adds `_` keys to the context in file order, and the
    # derived defaults below look them up. copier renders them (a family's layouts); so do we.
    out: dict = {private: answers.complete({})[name] for name, private in PRIVATE_TABLES.items()}
    # copier's regex_* filters, and the template's globals the defaults call (a family's recipe), which
    # cookiecutter imports from the template's folder
    out["_extensions"] = ["jinja2_ansible_filters.AnsibleCoreFiltersExtension", "hooks.copier_extension.RulesExtension"]
    prompts: dict = {}
    for key in asked:
        q = questions[key]
        default = q.get("default", "")
        if q.get("multiselect"):
            default = ",".join(default)
        elif isinstance(default, str):
            default = _translate(default, names)
        out[key] = default
        values = answers._choices(q)
        text = " ".join(_help(q, key).split())
        if q.get("multiselect"):
            text += f" (comma-separated, from: {','.join(map(str, values))})"
        elif values:
            text += f" ({' | '.join(map(str, values))})"
        prompts[key] = f"{key}: {text}"
    out["__prompts__"] = prompts
    return out


def _help(question: dict, key: str) -> str:
    """copier's help, rendered as copier renders it; one per model where it depends on the model."""
    text = str(question.get("help", key))
    if "{{" not in text:
        return text
    models = answers._choices(answers.questions()["model"])
    rendered = [answers._default_template(text).render(model=model) for model in models]
    return "; ".join(dict.fromkeys(rendered))


def _dump(data: dict) -> str:
    return json.dumps(data, indent=2, ensure_ascii=True) + "\n"


if __name__ == "__main__" and "--write" in sys.argv:
    COOKIECUTTER_JSON.write_text(_dump(derive_cookiecutter_json()))
    print(f"wrote {COOKIECUTTER_JSON}")
    sys.exit(0)


# --- Tests ----------------------------------------------------------------------------------------


def cookiecutter(out: Path, answers: dict, tmp: Path):
    """`cookiecutter --no-input <template> key=value ...` into `out`, with a private config (replay dir)."""
    assert (BIN / "cookiecutter").exists(), "cookiecutter is missing: pip install -r requirements-dev.txt"
    config = tmp / "cookiecutter-config.yaml"
    config.write_text(yaml.safe_dump({"replay_dir": str(tmp / "replay"), "cookiecutters_dir": str(tmp / "cc")}))
    cmd = [str(BIN / "cookiecutter"), "--no-input", "--config-file", str(config), "-o", str(out), str(TEMPLATE)]
    return run(cmd + [f"{k}={v}" for k, v in answers.items()], cwd=tmp)


def tree(root: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file under root: (contents, executable) by relative path."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), bool(p.stat().st_mode & 0o111))
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# name: (cookiecutter answers, the same answers for copier --data)
SAME_ANSWERS = {
    "defaults": ({}, {}),
    "kubeflow-slurm-2-nodes": (
        {"project_name": "Kube Slurm", "platforms": "kubeflow,slurm", "nodes": 2, "slurm_partition": "gpu"},
        {"project_name": "Kube Slurm", "platforms": "[kubeflow, slurm]", "nodes": 2, "slurm_partition": "gpu"},
    ),
    # Quotes, backslash, $, ; and unicode pass through the hook's embedded JSON context intact.
    "odd-name": (
        {"project_name": '\u00dcn\u00efcode "q" it\'s $HOME; a\\b'},
        {"project_name": '\u00dcn\u00efcode "q" it\'s $HOME; a\\b'},
    ),
    "gpt3-preset": (
        {"project_name": "G3 Pipe", "model": "gpt3", "gpt3_layout": "1.3b-4dp-4pp"},
        {"project_name": "G3 Pipe", "model": "gpt3", "gpt3_layout": "1.3b-4dp-4pp"},
    ),
}


def test_cookiecutter_json_is_derived_from_copier_yml():
    """Same questions, same defaults: cookiecutter.json is exactly what copier.yml derives."""
    assert json.loads(COOKIECUTTER_JSON.read_text()) == derive_cookiecutter_json(), (
        "cookiecutter.json is out of date with copier.yml: run  python tests/test_cookiecutter.py --write"
    )
    spec = yaml.safe_load((TEMPLATE / "copier.yml").read_text())
    asked = [k for k, v in spec.items() if not k.startswith("_") and v.get("when") is not False]
    cc = json.loads(COOKIECUTTER_JSON.read_text())
    assert [k for k in cc if not k.startswith("_")] == asked


@pytest.mark.parametrize("name", SAME_ANSWERS)
def test_cookiecutter_and_copier_make_the_same_project(tmp_path, name):
    cc_answers, copier_answers = SAME_ANSWERS[name]
    result = cookiecutter(tmp_path / "cc", cc_answers, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    made = [p for p in (tmp_path / "cc").iterdir()]
    assert len(made) == 1, made
    by_cookiecutter = tree(made[0])
    result = copier_copy(tmp_path / "copier" / made[0].name, copier_answers)
    assert result.returncode == 0, result.stdout + result.stderr
    by_copier = tree(tmp_path / "copier" / made[0].name)
    assert sorted(by_cookiecutter) == sorted(by_copier)
    # _commit may differ only when the template checkout has uncommitted changes: copier then
    # clones HEAD and commits the working tree on top ("Copier automated commit for draft
    # changes"), a new commit id on every run, whichever front end calls it.
    if run(["git", "status", "--porcelain"], cwd=TEMPLATE).stdout.strip():
        for files in (by_cookiecutter, by_copier):
            text, mode = files[".copier-answers.yml"]
            files[".copier-answers.yml"] = (re.sub(rb"(?m)^_commit: .*$", b"_commit: <draft>", text), mode)
    differ = [path for path in by_copier if by_copier[path] != by_cookiecutter[path]]
    assert not differ, f"files differ between cookiecutter and copier: {differ}"
    recorded = yaml.safe_load(by_cookiecutter[".copier-answers.yml"][0])
    assert recorded["_src_path"] == str(TEMPLATE)  # `copier update` works from the cookiecutter project
    assert not any(p.endswith(".cookiecutter-placeholder") or "cookiecutter" in p for p in by_cookiecutter)


# (answers, the field its one problem line starts with, what that line says)
BAD = [
    ({"project_name": "Bad Slug", "project_slug": "My-Run"}, "project_slug", "lowercase letters and digits"),
    (
        {
            "project_name": "Too Big",
            "model": "gpt3",
            "gpt3_layout": "custom",
            "model_size": "13B",
            "nodes": 1,
            "gpus_per_node": 8,
            "gpu_type": "v100-16gb",
        },
        "gpu_type",
        "does not fit",
    ),
    ({"platforms": "devmachine,aws"}, "platforms", "e.g. platforms=devmachine,slurm"),
    ({"nodes": "two"}, "nodes", "nodes 'two' is not a whole number; give one such as nodes=1"),
    ({"nodes": "1.5"}, "nodes", "nodes '1.5' is not a whole number"),
    ({"model": "t5"}, "model", "model 't5' is not one of bert, gpt, gpt3"),
    ({"project_slug": "torch"}, "project_slug", "choose another, e.g. 'torchtrain'"),
    (
        {"data_dir": "/mnt/shared/x/data", "output_dir": "/mnt/shared/x/data/runs"},
        "output_dir",
        "lies inside data_dir '/mnt/shared/x/data'",
    ),
    # names cookiecutter.json lacks: cookiecutter drops them before the hook, which reads its command line
    ({"node": "4"}, "node", "unknown answer 'node': did you mean 'nodes'?"),
    ({"answers_check": "ok"}, "answers_check", "answer 'answers_check' is computed from the other answers"),
]


@pytest.mark.parametrize("answers, field, says", BAD, ids=[field for _, field, _ in BAD])
def test_bad_answer_stops_cookiecutter_and_leaves_nothing(tmp_path, answers, field, says):
    out = tmp_path / "out"
    out.mkdir()
    result = cookiecutter(out, answers, tmp_path)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    problem = re.findall(r"(?m)^  (?!File )(\S.*)$", result.stderr)  # our lines; cookiecutter's frames aside
    assert len(problem) == 1 and re.match(rf"{field}[:=]", problem[0]) and says in problem[0], output
    # cookiecutter itself logs its FailedHookException with a traceback; none comes from our code.
    frames = re.findall(r'File "([^"]+)"', output)
    assert all("/cookiecutter/" in f for f in frames), frames
    assert list(out.iterdir()) == [], "cookiecutter left files behind"


def test_failure_after_the_checks_still_leaves_nothing(tmp_path):
    """If copier fails inside post_gen (here: a copy of the template whose pre_gen hands copier
    nodes=0 after its checks passed), cookiecutter still deletes the project folder."""
    copy = tmp_path / "template"
    archive = run(["git", "archive", "HEAD", "--prefix=template/", "-o", str(tmp_path / "t.tar")], cwd=TEMPLATE)
    assert archive.returncode == 0, archive.stderr
    assert run(["tar", "-xf", str(tmp_path / "t.tar"), "-C", str(tmp_path)]).returncode == 0
    hook = copy / "hooks" / "pre_gen_project.py"
    text = hook.read_text()
    marker = "    Path(ANSWERS_FILE).write_text("
    assert marker in text
    hook.write_text(text.replace(marker, '    answers["nodes"] = 0\n' + marker))
    out = tmp_path / "out"
    out.mkdir()
    config = tmp_path / "cookiecutter-config.yaml"
    config.write_text(yaml.safe_dump({"replay_dir": str(tmp_path / "replay")}))
    result = run([str(BIN / "cookiecutter"), "--no-input", "--config-file", str(config), "-o", str(out), str(copy)])
    assert result.returncode != 0
    assert "copier could not render the project" in result.stderr and "'nodes'" in result.stderr, result.stderr
    assert list(out.iterdir()) == [], "cookiecutter left files behind"

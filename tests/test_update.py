"""`copier update` across template releases, each scenario a real git history.

    python -m pytest -q tests/test_update.py

The template is copied into tmp, committed and tagged (vX.Y.Z releases) or left untagged as users
get main (a clone of this repository at an earlier commit); a project is generated from it,
committed, edited as a user would and committed; the template changes (a newer tag, or the working
tree as the newest commit); `copier update` runs in the project. Also: the migrations of copier.yml
(`_migrations`, migrations/), the message after copy and the generated project's CI.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import yaml
from conftest import BIN, TEMPLATE, copier_copy, git, run

MIGRATIONS = TEMPLATE / "migrations"

SLUG = "upd"
PLATFORMS = "[devmachine,kubeflow,tione,slurm]"
DEVMACHINE_SH = "template/launch/{% if 'devmachine' in platforms %}devmachine{% endif %}/train.sh.jinja"


def commit_all(repo: Path, message: str, tag: str | None = None) -> None:
    git(repo, "add", "-A")
    # --allow-empty: a clone of a clean checkout already holds the template of today as its newest commit
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    if tag:
        git(repo, "tag", tag)


def snapshot_template(dst: Path) -> Path:
    """The template's working tree (uncommitted changes included) copied into a new git repository."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard"], cwd=TEMPLATE).stdout.split("\n")
    for rel in filter(None, listed):
        src = TEMPLATE / rel
        if src.is_file() and "__pycache__" not in rel:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    git(dst, "init", "-q", "-b", "main")
    return dst


def copier(project: Path, *args: str):
    return run([str(BIN / "copier"), *args], cwd=project)


def check(project: Path):
    """The generated project's `check`, from its source tree, as its conftest.py runs the package."""
    return run([sys.executable, "-m", SLUG, "check"], cwd=project, env={"PYTHONPATH": str(project / "src")})


def generate(tmp_path: Path, tpl: Path, vcs_ref: str | None = None, **extra) -> Path:
    project = tmp_path / "project"
    data = {
        "project_name": "Upd",
        "project_slug": SLUG,
        "platforms": PLATFORMS,
        "shared_mount": str(tmp_path),
        "data_dir": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "runs"),
        **extra,
    }
    result = copier_copy(project, data, src=f"git+file://{tpl}", extra=[f"--vcs-ref={vcs_ref}"] if vcs_ref else [])
    assert result.returncode == 0, result.stdout + result.stderr
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "generated")
    return project


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} not found once in {path}"
    path.write_text(text.replace(old, new))


def test_update_keeps_user_edits_then_nodes_rerenders_every_launch_file(tmp_path):
    tpl = snapshot_template(tmp_path / "template")
    commit_all(tpl, "template", tag="v0.1.0")
    project = generate(tmp_path, tpl)
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == "v0.1.0"
    cfg_path = project / "config/train.yaml"

    # The user: hyper-parameters, a line in the model code, a new file.
    edit(cfg_path, "lr: 0.0003", "lr: 0.0006")
    edit(cfg_path, "warmup_steps: 40", "warmup_steps: 25")
    gpt_py = project / f"src/{SLUG}/models/gpt/model.py"
    gpt_py.write_text(gpt_py.read_text() + "\nUSER_MARK = 'added by the user'\n")
    (project / "notes").mkdir()
    (project / "notes/experiments.md").write_text("# lr sweep\n0.0006 looked best\n")
    commit_all(project, "user edits")

    # The template: a comment far from the user's edits, a new file, a changed launch script; v0.2.0.
    yaml_jinja = tpl / "template/config/train.yaml.jinja"
    yaml_jinja.write_text(yaml_jinja.read_text() + "# Template comment added in v0.2.0.\n")
    (tpl / "template/RELEASE-NOTES.md").write_text("Template v0.2.0: release notes file.\n")
    edit(tpl / DEVMACHINE_SH, "set -euo pipefail\n", "set -euo pipefail\n# Launch script line added in v0.2.0.\n")
    commit_all(tpl, "template v0.2.0", tag="v0.2.0")

    # copier check-update sees the newer tag (the command the generated CI runs): --quiet exits 2.
    outdated = copier(project, "check-update", "--quiet")
    assert outdated.returncode == 2, outdated.stdout + outdated.stderr

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    text = cfg_path.read_text()
    cfg = yaml.safe_load(text)
    assert cfg["optim"]["lr"] == 0.0006 and cfg["schedule"]["warmup_steps"] == 25, "a user edit was lost"
    assert "USER_MARK = 'added by the user'" in gpt_py.read_text()
    assert (project / "notes/experiments.md").read_text() == "# lr sweep\n0.0006 looked best\n"
    assert "# Template comment added in v0.2.0." in text
    assert (project / "RELEASE-NOTES.md").read_text() == "Template v0.2.0: release notes file.\n"
    assert "# Launch script line added in v0.2.0." in (project / "launch/devmachine/train.sh").read_text()
    assert not list(project.rglob("*.rej")) and "<<<<<<<" not in text
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == "v0.2.0"
    current = copier(project, "check-update", "--quiet")
    assert current.returncode == 0, current.stdout + current.stderr
    commit_all(project, "update to v0.2.0")

    # A new shape: every launch file and the config follow, the user's edits stay, and the recipe
    # too (strong scaling): the global batch and the token budget are kept, the accumulation shrinks.
    before = yaml.safe_load(cfg_path.read_text())
    assert "micro 16 x accum 2 x data-parallel 8" in check(project).stdout
    reshape = copier(project, "update", "--defaults", "--trust", "--conflict", "inline", "--data", "nodes=4")
    assert reshape.returncode == 0, reshape.stdout + reshape.stderr
    cfg = yaml.safe_load(cfg_path.read_text())
    assert cfg["cluster"]["nodes"] == 4 and cfg["cluster"]["gpus_per_node"] == 8
    batch = cfg["batch"]
    assert batch["scaling"] == "strong" and batch["global_batch_size"] == before["batch"]["global_batch_size"] == 256
    tokens = cfg["schedule"]["max_steps"] * batch["global_batch_size"]
    assert tokens == before["schedule"]["max_steps"] * before["batch"]["global_batch_size"]
    # micro 16 x 32 ranks would exceed 256 sequences: the micro batch is lowered to fit, never raised
    assert batch["micro_batch_size"] == 8 and batch["grad_accum_steps"] is None
    assert (
        "grad_accum_steps: null # null = global / (micro x data-parallel size): 1 on 4 x 8 GPUs" in cfg_path.read_text()
    )
    assert cfg["optim"]["lr"] == 0.0006 and cfg["schedule"]["warmup_steps"] == 25
    sbatch = (project / "launch/slurm/train.sbatch").read_text()
    assert re.findall(r"^#SBATCH --nodes=(\S+)$", sbatch, re.M) == ["4"]
    specs = yaml.safe_load((project / "launch/kubeflow/pytorchjob.yaml").read_text())["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 3
    trainjob = yaml.safe_load((project / "launch/kubeflow/trainjob.yaml").read_text())
    assert trainjob["spec"]["trainer"]["numNodes"] == 4
    devmachine = (project / "launch/devmachine/train.sh").read_text()
    # The dev-machine script takes the node count at run time; it kept v0.2.0's line.
    assert "NNODES=${NNODES:-1}" in devmachine and "# Launch script line added in v0.2.0." in devmachine
    assert "4 nodes x 8 GPUs" in (project / "launch/kubeflow/pytorchjob.yaml").read_text()
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["nodes"] == 4
    checked = check(project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "global batch 256 = micro 8 x accum 1 x data-parallel 32" in checked.stdout
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["global_batch_size"] == 256


def test_conflicting_edit_leaves_markers_and_check_fails(tmp_path):
    tpl = snapshot_template(tmp_path / "template")
    commit_all(tpl, "template", tag="v0.1.0")
    project = generate(tmp_path, tpl)
    cfg_path = project / "config/train.yaml"
    edit(cfg_path, "keep_last: 3", "keep_last: 5")
    commit_all(project, "user: more checkpoints kept")
    edit(tpl / "template/config/train.yaml.jinja", "keep_last: 3", "keep_last: 4")
    commit_all(tpl, "template: new default", tag="v0.2.0")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    text = cfg_path.read_text()
    assert "<<<<<<<" in text and ">>>>>>>" in text, text
    assert "keep_last: 5" in text and "keep_last: 4" in text, "both sides must be kept"
    checked = check(project)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "unresolved merge conflict markers in" in checked.stderr and "config/train.yaml" in checked.stderr
    assert "Traceback" not in checked.stderr


def test_migration_adopts_zero_stage_from_train_yaml(tmp_path):
    """The real migration: before 0.1.0 the ZeRO stage lived only in config/train.yaml."""
    tpl = snapshot_template(tmp_path / "template")
    questions = (tpl / "copier.yml").read_text()
    old = re.sub(r"\nzero_stage:\n.*?\n(?=platforms:\n)", "\n", questions, flags=re.S)
    assert old != questions and "\nzero_stage:" not in old
    (tpl / "copier.yml").write_text(old)
    edit(tpl / "template/config/train.yaml.jinja", "{{ zero_stage if strategy == 'deepspeed' else 1 }}", "1")
    commit_all(tpl, "template before zero_stage was asked", tag="v0.0.9")
    project = generate(tmp_path, tpl, strategy="deepspeed", platforms="[devmachine]")
    assert "zero_stage" not in yaml.safe_load((project / ".copier-answers.yml").read_text())
    edit(project / "config/train.yaml", "zero_stage: 1 ", "zero_stage: 2 ")
    commit_all(project, "user: ZeRO-2")
    (tpl / "copier.yml").write_text(questions)
    git(tpl, "checkout", "-q", "--", "template/config/train.yaml.jinja")
    commit_all(tpl, "zero_stage asked", tag="v0.1.0")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "answer 'zero_stage' = 2, taken from config/train.yaml" in update.stderr
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["zero_stage"] == 2 and answers["_commit"] == "v0.1.0"
    assert yaml.safe_load((project / "config/train.yaml").read_text())["deepspeed"]["zero_stage"] == 2
    # Idempotent: a second run leaves the answers file as it is.
    before = (project / ".copier-answers.yml").read_text()
    again = run(
        [
            sys.executable,
            str(TEMPLATE / "migrations/answers.py"),
            "adopt",
            "zero_stage",
            "deepspeed.zero_stage",
            "--if",
            "strategy=deepspeed",
        ],
        cwd=project,
    )
    assert again.returncode == 0 and "already recorded" in again.stderr
    assert (project / ".copier-answers.yml").read_text() == before


MINI_COPIER = """\
_subdirectory: template
_answers_file: .copier-answers.yml
_templates_suffix: .jinja
{migrations}
{name}:
  type: str
  default: plain
"""
RENAME_MIGRATION = """\
_migrations:
  - version: "0.2.0"
    when: "{{ _stage == 'before' }}"
    command: ["{{ _copier_python }}", "{{ _copier_conf.src_path }}/migrations/answers.py", rename, old_name, new_name]
"""


def test_migration_renames_a_question_and_keeps_the_value(tmp_path):
    """Tag A asks old_name; tag B renames it to new_name with a migration; the user's value survives."""
    tpl = tmp_path / "template"
    (tpl / "template").mkdir(parents=True)
    (tpl / "migrations").mkdir()
    shutil.copy2(TEMPLATE / "migrations/answers.py", tpl / "migrations/answers.py")
    (tpl / "template/{{_copier_conf.answers_file}}.jinja").write_text("{{ _copier_answers|to_nice_yaml -}}\n")
    (tpl / "copier.yml").write_text(MINI_COPIER.format(migrations="", name="old_name"))
    (tpl / "template/note.txt.jinja").write_text("note: {{ old_name }}\n")
    git(tpl, "init", "-q", "-b", "main")
    commit_all(tpl, "A", tag="v0.1.0")

    value = 'it\'s "quoted" $HOME; rm -rf x \u00e9'
    project = tmp_path / "project"
    result = copier_copy(project, {"old_name": value}, src=f"git+file://{tpl}")
    assert result.returncode == 0, result.stdout + result.stderr
    git(project, "init", "-q", "-b", "main")
    commit_all(project, "generated")

    (tpl / "copier.yml").write_text(MINI_COPIER.format(migrations=RENAME_MIGRATION, name="new_name"))
    (tpl / "template/note.txt.jinja").write_text("note: {{ new_name }}\n")
    commit_all(tpl, "B: old_name renamed", tag="v0.2.0")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["new_name"] == value and "old_name" not in answers and answers["_commit"] == "v0.2.0"
    assert (project / "note.txt").read_text() == f"note: {value}\n"
    # Idempotent: renaming again changes nothing.
    before = (project / ".copier-answers.yml").read_text()
    again = run([sys.executable, str(tpl / "migrations/answers.py"), "rename", "old_name", "new_name"], cwd=project)
    assert again.returncode == 0 and "nothing to rename" in again.stderr
    assert (project / ".copier-answers.yml").read_text() == before


def test_message_after_copy_and_generated_ci(tmp_path):
    project = tmp_path / "project"
    data = {
        "project_name": "Upd",
        "project_slug": SLUG,
        "platforms": "[slurm,kubeflow]",
        "strategy": "deepspeed",
        "shared_mount": str(tmp_path),
        "data_dir": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "runs"),
    }
    result = copier_copy(project, data)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout + result.stderr
    assert "Next three commands (kubeflow, slurm;" in out, out
    assert f"1. cd {project} && bash scripts/install.sh" in out
    assert f"2. {SLUG} check && {SLUG} prepare-data" in out
    assert re.search(rf"3\. {SLUG} launch kubeflow .*\n\s+{SLUG} launch slurm\n", out), out
    assert "launch devmachine" not in out

    workflow = yaml.safe_load((project / ".github/workflows/ci.yml").read_text())
    assert set(workflow["jobs"]) == {"tests", "template"}
    assert workflow[True] == ["push", "pull_request"]  # YAML 1.1 reads the key `on` as True
    tests = "\n".join(step.get("run", "") for step in workflow["jobs"]["tests"]["steps"])
    assert "--index-url https://download.pytorch.org/whl/cpu" in tests and "python -m pytest -q" in tests
    assert "apt-get install -y slurm-client" in tests
    assert "bash scripts/install.sh test," in tests and "ruff check . && ruff format --check ." in tests
    install = (project / "scripts/install.sh").read_text()
    extras = re.search(r'^extras="([a-z,]+)', install, re.M).group(1).split(",")
    extras += re.search(r"bash scripts/install.sh ([a-z,]+)", tests).group(1).split(",")
    assert {"deepspeed", "kubeflow", "image", "test"} <= set(extras) and "tione" not in extras
    assert "DS_BUILD_OPS=0" in install and "--no-build-isolation deepspeed" in install
    pyproject = (project / "pyproject.toml").read_text()
    for extra in extras:
        assert re.search(rf"^{extra} = \[", pyproject, re.M), f"extra {extra} is not in pyproject.toml"
    template_job = "\n".join(step.get("run", "") for step in workflow["jobs"]["template"]["steps"])
    assert "copier check-update --quiet" in template_job
    assert copier(project, "check-update", "--help").returncode == 0
    syntax = run(["bash", "-n", "-c", workflow["jobs"]["template"]["steps"][-1]["run"]])
    assert syntax.returncode == 0, syntax.stderr


# The last commit before the launch modules moved into the launch/ package (launch.py,
# launch_kubeflow.py, launch_slurm.py, ... in the flat package; node.py holding project_root).
BEFORE_LAUNCH_PACKAGE = "9e638b4"


def template_at(commit: str, dst: Path) -> Path:
    """The template as it was at `commit` of this repository, as a repository of its own."""
    known = run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=TEMPLATE)
    assert known.returncode == 0, (
        f"commit {commit} is not in {TEMPLATE}: this test needs the repository's history (a full clone, not --depth 1)"
    )
    dst.mkdir(parents=True)
    archive = run(["bash", "-c", f"git archive {commit} | tar -x -C {dst}"], cwd=TEMPLATE)
    assert archive.returncode == 0, archive.stderr
    git(dst, "init", "-q", "-b", "main")
    return dst


def release_today(tpl: Path, message: str, tag: str | None = "v0.3.0") -> None:
    """The template of today, committed over an older one in the same repository as its next release
    (a tag), or as the newest commit of an untagged main (tag None)."""
    for child in tpl.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    snapshot_template(tpl)
    commit_all(tpl, message, tag=tag)


def test_update_across_the_launch_package_move_keeps_user_edits(tmp_path):
    """A project made when the launch code was flat modules: `copier update` removes them, adds the
    launch/ package, keeps a user edit beside them, and every launch entry point works after it."""
    tpl = template_at(BEFORE_LAUNCH_PACKAGE, tmp_path / "template")
    commit_all(tpl, "template before the move", tag="v0.1.0")
    project = generate(tmp_path, tpl)
    package = project / "src" / SLUG
    assert (package / "launch_slurm.py").is_file() and not (package / "launch").exists()
    # The user: a line in a module that stays beside the moved ones, and in a platform's launch file.
    topology = package / "topology.py"
    edit(topology, "DEFAULT_PORT = 29500\n", "DEFAULT_PORT = 29500\nUSER_MARK = 'kept across the move'\n")
    edit(project / "launch/slurm/train.sbatch", "#SBATCH --requeue\n", "#SBATCH --requeue\n#SBATCH --comment=user\n")
    commit_all(project, "user edits")

    release_today(tpl, "template after the move")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    topology = package / "settings" / "topology.py"  # moved again since; the migration carries the edit
    assert "USER_MARK = 'kept across the move'" in topology.read_text()
    assert "#SBATCH --comment=user" in (project / "launch/slurm/train.sbatch").read_text()
    flat = sorted(p.name for p in package.glob("launch*.py"))
    assert flat == [], f"moved modules left behind: {flat}"
    assert {"__init__.py", "base.py", "jobs.py", "slurm", "tione"} <= {p.name for p in (package / "launch").iterdir()}
    assert (package / "launch" / "tione" / "platform.py").is_file()
    assert (project / "launch/tione/task.yaml").is_file()
    assert not list(project.rglob("*.rej")) and "<<<<<<<" not in topology.read_text()
    env = {"PYTHONPATH": str(project / "src")}
    for platform in ("devmachine", "kubeflow", "slurm", "tione"):
        proc = run([sys.executable, "-m", SLUG, "launch", platform, "--dry-run"], cwd=project, env=env)
        assert proc.returncode == 0, f"launch {platform} --dry-run after the update:\n{proc.stdout}\n{proc.stderr}"
    assert check(project).returncode == 0


# The last commit before the package was regrouped: plan/doctor/image split, gpus.py, splits.py,
# trained_model.py, tensor parallelism moved into strategies/, one module per command.
BEFORE_REGROUPING = "ecc3f6e"


def test_update_across_the_package_regrouping_keeps_user_edits(tmp_path):
    """A project made before the regrouping: `copier update` replaces split modules by their parts,
    keeps a user's edit in a module that stays and a module the user added, and the package it leaves
    passes its own shape test (layers, no cycles, no stale module) and runs its commands."""
    tpl = template_at(BEFORE_REGROUPING, tmp_path / "template")
    commit_all(tpl, "template before the regrouping", tag="v0.1.0")
    project = generate(tmp_path, tpl, model="gpt3", gpt3_layout="125m-1gpu", gpus_per_node=2)
    package = project / "src" / SLUG
    assert (package / "plan.py").read_text().count("\n") > 500 and not (package / "fit.py").exists()
    train = package / "train.py"
    edit(train, "def run_training(", "USER_MARK = 'kept across the regrouping'\n\n\ndef run_training(")
    (package / "my_callbacks.py").write_text('"""A module of the user\'s own."""\n')
    commit_all(project, "user edits")

    release_today(tpl, "template after the regrouping")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    train = package / "training" / "train.py"  # moved since; the migration carries the edit
    assert "USER_MARK = 'kept across the regrouping'" in train.read_text() and "<<<<<<<" not in train.read_text()
    assert (package / "my_callbacks.py").is_file() and not list(project.rglob("*.rej"))
    for new in (
        "planning/fit.py",
        "planning/estimates.py",
        "settings/gpus.py",
        "evaluation/trained_model.py",
        "strategies/deepspeed/tensor_parallel.py",
    ):
        assert (package / new).is_file(), f"{new} missing after the update"
    assert not re.search(r"^\s*(import|from) deepspeed", (package / "models/gpt3/model.py").read_text(), re.M)
    (package / "my_callbacks.py").unlink()  # the shape test lists every module; the user's own is not in it
    env = {"PYTHONPATH": str(project / "src")}
    shape = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_package_shape.py"],
        cwd=project,
        env=env,
    )
    assert shape.returncode == 0, shape.stdout + shape.stderr
    for command in (["plan"], ["sample", "--help"], ["doctor", "--help"], ["launch", "slurm", "--dry-run"]):
        proc = run([sys.executable, "-m", SLUG, *command], cwd=project, env=env)
        assert proc.returncode == 0, f"{' '.join(command)} after the update:\n{proc.stdout}\n{proc.stderr}"
    assert check(project).returncode == 0


# The last commit before the package's modules moved into folders named for their concerns
# (settings/, data/, runtime/, training/, evaluation/, planning/, cluster/, diagnostics/, image/).
BEFORE_FOLDERS = "db17459"


def test_update_into_concern_folders_carries_edits_in_moved_modules(tmp_path):
    """A project made when the package was flat: its user's edits in modules that moved (one moved
    whole, one renamed, one merged into another) and in train.yaml survive `copier update`; the
    moved module gets the edit merged in, the merged one a patch beside its new home; the package
    passes its own shape test and runs."""
    tpl = template_at(BEFORE_FOLDERS, tmp_path / "template")
    commit_all(tpl, "template before the folders", tag="v0.1.0")
    project = generate(tmp_path, tpl)
    package = project / "src" / SLUG
    assert (package / "sample.py").is_file() and not (package / "evaluation").exists()
    edit(
        package / "sample.py",
        "def run(cfg: Config, args",
        "USER_SAMPLE = 'kept in evaluation/sample.py'\n\n\ndef run(cfg: Config, args",
    )
    edit(package / "data.py", "def find_data(", "USER_DATA = 'kept in data/tokens.py'\n\n\ndef find_data(")
    edit(
        package / "verdicts.py",
        'OK, WARN, FAIL, NA = "ok", "warn", "FAIL", "n/a"',
        'OK, WARN, FAIL, NA = "ok", "warn", "FAIL", "n/a"  # mine',
    )
    edit(project / "config/train.yaml", "  eval_every_steps: ", "  # the user's note\n  eval_every_steps: ")
    commit_all(project, "user edits")

    release_today(tpl, "template with concern folders")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    assert not (package / "sample.py").exists() and not (package / "data.py").exists()
    sample = (package / "evaluation" / "sample.py").read_text()
    assert "USER_SAMPLE = 'kept in evaluation/sample.py'" in sample and "<<<<<<<" not in sample
    assert "from ..settings.config import" in sample  # the new release's imports, with the user's line
    tokens = (package / "data" / "tokens.py").read_text()
    assert "USER_DATA = 'kept in data/tokens.py'" in tokens and "<<<<<<<" not in tokens
    patch = package / "diagnostics" / "__init__.py.verdicts.diff"
    assert '"n/a"  # mine' in patch.read_text() and "verdicts.py" in update.stdout + update.stderr
    assert "  # the user's note\n  eval_every_steps: " in (project / "config/train.yaml").read_text()
    assert not list(project.rglob("*.rej")) and not (project / ".git" / "moved-module-edits").exists()
    patch.unlink()
    env = {"PYTHONPATH": str(project / "src")}
    shape = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_package_shape.py"],
        cwd=project,
        env=env,
    )
    assert shape.returncode == 0, shape.stdout + shape.stderr
    for command in (["plan"], ["sample", "--help"], ["launch", "slurm", "--dry-run"]):
        proc = run([sys.executable, "-m", SLUG, *command], cwd=project, env=env)
        assert proc.returncode == 0, f"{' '.join(command)} after the update:\n{proc.stdout}\n{proc.stderr}"
    assert check(project).returncode == 0


# The last commit before the Kubeflow placement answers (rdma_per_pod, node labels, tolerations, CPU and
# memory, gang scheduling, priority class).
BEFORE_PLACEMENT = "e59413c"


def test_update_keeps_older_kubeflow_manifests_then_takes_placement_answers(tmp_path):
    """A Kubeflow project made before the placement questions: `copier update` with the defaults leaves
    its manifests line for line as they were (comments aside); answering the new questions on a later update renders
    them, and the manifests still pass their CRD schemas."""
    from k8s_schemas import validation_errors

    tpl = template_at(BEFORE_PLACEMENT, tmp_path / "template")
    commit_all(tpl, "template before the placement answers", tag="v0.1.0")
    project = generate(tmp_path, tpl, strategy="deepspeed", nodes=2, gpus_per_node=2)
    kubeflow = project / "launch" / "kubeflow"

    def manifests() -> dict[str, str]:
        """Each manifest's lines but its comments: those are the template's prose and follow its
        wording; what Kubernetes reads must not change."""
        return {
            p.name: "\n".join(line for line in p.read_text().splitlines() if not line.lstrip().startswith("#"))
            for p in sorted(kubeflow.glob("*.yaml"))
        }

    before = manifests()
    assert set(before) == {"pytorchjob.yaml", "trainjob.yaml", "mpijob.yaml"}

    release_today(tpl, "template with the placement answers")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    assert manifests() == before
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert (answers["rdma_per_pod"], answers["k8s_gang_scheduler"], answers["k8s_node_labels"]) == (1, "none", "")
    commit_all(project, "updated")

    update = copier(
        project,
        "update",
        "--defaults",
        "--trust",
        "--data",
        "rdma_per_pod=2",
        "--data",
        "k8s_node_labels=nvidia.com/gpu.product=NVIDIA-A800-SXM4-80GB",
        "--data",
        "k8s_tolerations=nvidia.com/gpu:NoSchedule",
        "--data",
        "k8s_memory_request=64Gi",
        "--data",
        "k8s_gang_scheduler=scheduler-plugins",
    )
    assert update.returncode == 0, update.stdout + update.stderr
    for name in before:
        job = yaml.safe_load((kubeflow / name).read_text())
        assert validation_errors(job) == [], name
    job = yaml.safe_load((kubeflow / "pytorchjob.yaml").read_text())
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2}
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["schedulerName"] == "scheduler-plugins-scheduler"
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["rdma/hca"] == 2 and resources["limits"]["memory"] == "64Gi"
    assert check(project).returncode == 0


# The batch section of the template before 0.2.0: the global batch derived from the node count.
BATCH_BEFORE_0_2 = """{#- The family's global batch (sequences), rounded to whole micro batches x data-parallel ranks. #}
{%- set world = nodes * gpus_per_node %}
{%- set dp = [1, world // (tp * pp)] | max %}
{%- set accum = [1, recipe.global_batch // (micro * dp)] | max %}

batch:
  global_batch_size: {{ micro * dp * accum }}   # sequences per optimizer step, all ranks together
  micro_batch_size: {{ micro }}   # sequences per forward/backward on one rank (one pipeline micro batch)
  grad_accum_steps: null # null = global / (micro x data-parallel size)

"""


def test_migration_keeps_the_global_batch_of_a_project_made_before_it_was_asked(tmp_path):
    """Before 0.2.0 every render derived the global batch from nodes x gpus_per_node: a 1 x 8 gpt
    project had 256 sequences per step, and `--data nodes=4` made it 512. The migration records the
    project's 256 as the global_batch_size answer, so the update to 4 nodes keeps the recipe."""
    tpl = snapshot_template(tmp_path / "template")
    questions = (tpl / "copier.yml").read_text()
    old = re.sub(r"\n# --- Batch: the recipe.*?\n(?=shared_mount:\n)", "\n", questions, flags=re.S)
    assert old != questions and "\nscaling:" not in old and "\nglobal_batch_size:" not in old
    (tpl / "copier.yml").write_text(old)
    yaml_jinja, readme = tpl / "template/config/train.yaml.jinja", tpl / "template/README.md.jinja"
    config_now, readme_now = yaml_jinja.read_text(), readme.read_text()
    config_then = re.sub(
        r"\{#- The recipe:.*?grad_accum_steps: null[^\n]*\n\n", BATCH_BEFORE_0_2, config_now, flags=re.S
    )
    assert config_then != config_now and "scaling" not in config_then
    yaml_jinja.write_text(config_then)
    readme.write_text(re.sub(r"## Scaling out\n.*?(?=## Files\n)", "", readme_now, flags=re.S))
    commit_all(tpl, "template before the global batch was asked", tag="v0.1.0")
    project = generate(tmp_path, tpl, platforms="[devmachine]")
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert "global_batch_size" not in answers and "scaling" not in answers
    cfg_path = project / "config/train.yaml"
    before = yaml.safe_load(cfg_path.read_text())
    assert before["batch"] == {"global_batch_size": 256, "micro_batch_size": 16, "grad_accum_steps": None}
    (tpl / "copier.yml").write_text(questions)
    yaml_jinja.write_text(config_now)
    readme.write_text(readme_now)
    commit_all(tpl, "global batch asked, strong scaling", tag="v0.2.0")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline", "--data", "nodes=4")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "answer 'global_batch_size' = 256, taken from config/train.yaml batch.global_batch_size" in update.stderr
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["global_batch_size"] == 256 and answers["scaling"] == "strong" and answers["nodes"] == 4
    assert answers["_commit"] == "v0.2.0"
    text = cfg_path.read_text()
    assert "<<<<<<<" not in text and not list(project.rglob("*.rej"))
    cfg = yaml.safe_load(text)
    assert cfg["cluster"]["nodes"] == 4 and cfg["batch"]["scaling"] == "strong"
    assert cfg["batch"]["global_batch_size"] == 256 and cfg["schedule"]["max_steps"] == before["schedule"]["max_steps"]
    checked = check(project)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "global batch 256 = micro 8 x accum 1 x data-parallel 32" in checked.stdout


def test_weak_scaling_update_grows_the_global_batch_with_the_nodes(tmp_path):
    """scaling=weak keeps the batch per GPU: 128 sequences on each of 2 GPUs is 256 per step on one
    node and 512 on two, the micro batch and the accumulation unchanged."""
    tpl = snapshot_template(tmp_path / "template")
    commit_all(tpl, "template", tag="v0.2.0")
    project = generate(tmp_path, tpl, platforms="[devmachine]", gpus_per_node=2, scaling="weak")
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["batch_per_gpu"] == 128 and "global_batch_size" not in answers
    cfg_path = project / "config/train.yaml"
    assert yaml.safe_load(cfg_path.read_text())["batch"] == {
        "scaling": "weak",
        "global_batch_size": 256,
        "micro_batch_size": 16,
        "grad_accum_steps": None,
    }
    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline", "--data", "nodes=2")
    assert update.returncode == 0, update.stdout + update.stderr
    batch = yaml.safe_load(cfg_path.read_text())["batch"]
    assert (batch["global_batch_size"], batch["micro_batch_size"]) == (512, 16)
    checked = check(project)
    assert "global batch 512 = micro 16 x accum 8 x data-parallel 4" in checked.stdout, checked.stdout + checked.stderr
    assert "weak scaling" in checked.stdout


def test_a_gpt_project_made_before_gpt_recipe_keeps_its_recipe_until_it_opts_in(tmp_path):
    """0.4.0 asks gpt_recipe (nanochat's by default); the migration records the earlier recipe for a
    project made before, so the update changes none of its training settings; --data opts in."""
    tpl = snapshot_template(tmp_path / "template")
    questions = (tpl / "copier.yml").read_text()
    old = re.sub(r"\ngpt_recipe:\n.*?\n(?=zero_stage:\n)", "\n", questions, flags=re.S)
    assert old != questions and "\ngpt_recipe:" not in old
    (tpl / "copier.yml").write_text(old)
    descriptor = tpl / "template/src/{{project_slug}}/models/gpt/descriptor.py"  # writes gpt's train.yaml lines
    recipe_py = descriptor.read_text()
    descriptor.write_text(recipe_py.replace('answers.get("gpt_recipe", "nanochat") == "nanochat"', "False"))
    assert descriptor.read_text() != recipe_py
    commit_all(tpl, "template before gpt_recipe was asked", tag="v0.3.0")
    project = generate(tmp_path, tpl, platforms="[devmachine]")
    before = yaml.safe_load((project / "config/train.yaml").read_text())
    assert before["optim"]["optimizer"] == "adamw" and before["schedule"]["decay"] == "cosine"
    (tpl / "copier.yml").write_text(questions)
    descriptor.write_text(recipe_py)
    commit_all(tpl, "gpt_recipe asked", tag="v0.4.0")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    assert "answer 'gpt_recipe' = 'adamw'" in update.stderr
    after = yaml.safe_load((project / "config/train.yaml").read_text())
    for section in ("model", "optim", "schedule"):
        assert after[section] == before[section], section
    commit_all(project, "update to v0.4.0")

    opt_in = copier(project, "update", "--defaults", "--trust", "--data", "gpt_recipe=nanochat", "--conflict", "inline")
    assert opt_in.returncode == 0, opt_in.stdout + opt_in.stderr
    now = yaml.safe_load((project / "config/train.yaml").read_text())
    assert now["optim"]["optimizer"] == "muon" and now["schedule"]["decay"] == "warmdown"
    assert now["model"]["rotary_base"] == 100000.0 and now["batch"] == before["batch"]


# The last commit before a model family became a folder, checkpoints one and each launch platform one.
BEFORE_FAMILY_FOLDERS = "a2ce5e4"


def test_update_into_family_folders_carries_edits_in_moved_modules(tmp_path):
    """A project made when the families were module pairs of models/, checkpoints lived in runtime/
    and TI-ONE's launch code was three modules: its user's edits there and in train.yaml reach the new
    homes through `copier update` (0.5.0's migration), the old files are gone, the family's tests
    moved into its folder, and the package passes its shape test and runs."""
    tpl = template_at(BEFORE_FAMILY_FOLDERS, tmp_path / "template")
    commit_all(tpl, "template before the family folders", tag="v0.4.0")
    project = generate(tmp_path, tpl, model="gpt3", gpt3_layout="custom", model_size="tiny", gpus_per_node=2)
    package = project / "src" / SLUG
    assert (package / "models" / "gpt3.py").is_file() and (project / "tests" / "test_gpt3.py").is_file()
    edit(
        package / "models" / "gpt3.py",
        "def build_gpt3(",
        "USER_GPT3 = 'kept in models/gpt3/model.py'\n\n\ndef build_gpt3(",
    )
    edit(package / "runtime" / "checkpoint_files.py", "def step_of(", "USER_FILES = 'kept'\n\n\ndef step_of(")
    edit(package / "launch" / "tione_request.py", "def load_task(", "USER_TIONE = 'kept'\n\n\ndef load_task(")
    edit(project / "config/train.yaml", "  eval_every_steps: ", "  # the user's note\n  eval_every_steps: ")
    commit_all(project, "user edits")

    release_today(tpl, "template with family folders", tag="v0.5.0")

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    for gone in ("models/gpt3.py", "models/gpt3_family.py", "runtime/checkpoint_files.py", "launch/tione_request.py"):
        assert not (package / gone).exists(), gone
    for home, mark in (
        ("models/gpt3/model.py", "USER_GPT3 = 'kept in models/gpt3/model.py'"),
        ("checkpoints/checkpoint_files.py", "USER_FILES = 'kept'"),
        ("launch/tione/request.py", "USER_TIONE = 'kept'"),
    ):
        text = (package / home).read_text()
        assert mark in text and "<<<<<<<" not in text, home
    assert (package / "models" / "gpt3" / "tests" / "test_gpt3.py").is_file()
    assert not (project / "tests" / "test_gpt3.py").exists() and (project / "conftest.py").is_file()
    assert "  # the user's note\n  eval_every_steps: " in (project / "config/train.yaml").read_text()
    assert not list(project.rglob("*.rej")) and not (project / ".git" / "moved-module-edits").exists()
    env = {"PYTHONPATH": str(project / "src")}
    shape = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_package_shape.py"],
                cwd=project, env=env)  # fmt: skip
    assert shape.returncode == 0, shape.stdout + shape.stderr
    for command in (["plan"], ["launch", "tione", "--dry-run"]):
        proc = run([sys.executable, "-m", SLUG, *command], cwd=project, env=env)
        assert proc.returncode == 0, f"{' '.join(command)} after the update:\n{proc.stdout}\n{proc.stderr}"
    assert check(project).returncode == 0


# An untagged commit of main as users copy it: before 0.5.0 gave each family a folder (models/gpt.py,
# tests/conftest.py, tests/test_new_family.py were there) and before gpt_recipe was asked.
UNTAGGED_BEFORE_FAMILY_FOLDERS = "e14ff80"


def test_update_from_an_untagged_commit_keeps_edits_in_moved_and_removed_files(tmp_path):
    """The repository carries no tags, so a project records a commit and copier reads both sides of
    the update as 0.0.0.postN, below every release: the migrations run all the same. Edits in a
    module that moved (models/gpt.py) and a test file that moved (tests/conftest.py, rendered from
    Jinja) reach their new homes; an edited test file the template removed is kept as a diff and
    named; the gpt project keeps the recipe it had before gpt_recipe was asked."""
    tpl = tmp_path / "template"
    cloned = run(["git", "clone", "-q", "--no-tags", str(TEMPLATE), str(tpl)])
    assert cloned.returncode == 0, cloned.stderr
    assert git(tpl, "tag") == "", "the clone must carry no tags, as users' copies of main"
    known = run(["git", "cat-file", "-e", f"{UNTAGGED_BEFORE_FAMILY_FOLDERS}^{{commit}}"], cwd=tpl)
    assert known.returncode == 0, f"{UNTAGGED_BEFORE_FAMILY_FOLDERS} is not in {TEMPLATE}: a full clone is needed"
    project = generate(tmp_path, tpl, vcs_ref=UNTAGGED_BEFORE_FAMILY_FOLDERS, platforms="[devmachine]")
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["_commit"] == UNTAGGED_BEFORE_FAMILY_FOLDERS and "gpt_recipe" not in answers
    package = project / "src" / SLUG
    edit(package / "models/gpt.py", "def rms_norm(", "USER_GPT = 'kept in models/gpt/model.py'\n\n\ndef rms_norm(")
    edit(project / "tests/conftest.py", "import pytest\n", "import pytest\n\nUSER_FIXTURES = 'kept'\n")
    edit(project / "tests/test_new_family.py", "import pytest\n", "import pytest\n\nUSER_FAMILY = 'kept'\n")
    before = yaml.safe_load((project / "config/train.yaml").read_text())
    commit_all(project, "user edits")

    release_today(tpl, "the template of today", tag=None)  # the newest commit of main
    newest = git(tpl, "rev-parse", "--short", "HEAD").strip()

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    out = update.stdout + update.stderr
    assert update.returncode == 0, out
    assert re.search(r"Updating to template version 0\.0\.0\.post\d+", out), out  # untagged on both sides
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == newest
    assert not (package / "models/gpt.py").exists() and not (project / "tests/conftest.py").exists()
    for home, mark in (
        (package / "models/gpt/model.py", "USER_GPT = 'kept in models/gpt/model.py'"),
        (project / "conftest.py", "USER_FIXTURES = 'kept'"),
    ):
        text = home.read_text()
        assert mark in text and "<<<<<<<" not in text, home
    patch = project / "tests/test_new_family.py.diff"
    assert not (project / "tests/test_new_family.py").exists()
    assert "+USER_FAMILY = 'kept'" in patch.read_text()
    assert "tests/test_new_family.py is no longer part of the template: your edits to it are kept in" in out
    assert str(patch.relative_to(project)) in out
    assert not list(project.rglob("*.rej")) and not (project / ".git/moved-module-edits").exists()
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["gpt_recipe"] == "adamw"
    after = yaml.safe_load((project / "config/train.yaml").read_text())
    assert after["optim"]["optimizer"] == "adamw" and after["optim"]["lr"] == before["optim"]["lr"]  # not muon's
    assert after["schedule"] == {**before["schedule"], "decay": "cosine"}  # not nanochat's warmdown
    checked = check(project)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# Files the template dropped without a successor (their tests went to the template's own tests/):
# an edit of one is kept as <path>.diff by migrations/moved_modules.py.
DROPPED_WITHOUT_SUCCESSOR = {"tests/test_layering.py", "tests/test_new_family.py"}


def project_path(template_path: str) -> str:
    """Where a file of template/ lands in a project: its conditions met, the package named PKG."""
    path = template_path.removeprefix("template/").replace("{{project_slug}}", "PKG")
    path = re.sub(r"\{%.*?%\}", "", path)
    return path.removesuffix(".jinja")


def test_every_file_the_history_moved_or_removed_is_known_to_the_migration():
    """A file the template stops writing at a path loses a user's edits unless moved_modules.py knows
    where it went (MOVED, MOVED_IN_PROJECT) or that it has no successor: read from this repository's
    history, so a move made without a line in those tables fails here."""
    spec = importlib.util.spec_from_file_location("moved_modules", MIGRATIONS / "moved_modules.py")
    moved_modules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moved_modules)
    history = run(
        ["git", "log", "-M", "--diff-filter=RD", "--name-status", "--format=", "--", "template/"], cwd=TEMPLATE
    )
    assert history.returncode == 0 and history.stdout, history.stderr
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "--", "template/"], cwd=TEMPLATE).stdout
    written_now = {project_path(path) for path in listed.splitlines()}
    unknown = set()
    for line in history.stdout.splitlines():
        old = project_path(line.split("\t")[1])
        home = moved_modules.home_of(old, "src/PKG")
        if old in written_now or old in DROPPED_WITHOUT_SUCCESSOR:
            continue
        if home is None:
            unknown.add(old)
        else:
            assert project_path(home.lstrip("+")) in written_now, f"{old}'s home {home} is not in template/"
    assert not unknown, f"add these to MOVED or MOVED_IN_PROJECT in migrations/moved_modules.py: {sorted(unknown)}"


# The last commit whose projects held every family, platform and DeepSpeed whatever was chosen.
BEFORE_CHOSEN_PARTS = "28135dc"


def test_update_to_a_project_of_its_chosen_parts_keeps_edits_and_adds_deepspeed_on_request(tmp_path):
    """A default project (gpt, DDP, dev machine) made when every project held every part: `copier update`
    removes the folders of the parts it was not made with, keeps an edit to one of them as a diff named
    in a line, and `check` refuses DeepSpeed in one line naming the update; `copier update --data
    strategy=deepspeed` brings DeepSpeed's folder and tests, and the check passes."""
    tpl = template_at(BEFORE_CHOSEN_PARTS, tmp_path / "template")
    commit_all(tpl, "template with every part")
    project = generate(tmp_path, tpl, platforms="[devmachine]")
    package = project / "src" / SLUG
    assert (package / "models/bert").is_dir() and (package / "strategies/deepspeed.py").is_file()
    edit(
        package / "models/bert/model.py", "def import_transformers():", "USER_BERT = 1\n\n\ndef import_transformers():"
    )
    edit(package / "settings/topology.py", "DEFAULT_PORT = 29500\n", "DEFAULT_PORT = 29500\nUSER_MARK = 'kept'\n")
    commit_all(project, "user edits")
    release_today(tpl, "a project holds what was chosen", tag=None)

    update = copier(project, "update", "--defaults", "--trust", "--conflict", "inline")
    assert update.returncode == 0, update.stdout + update.stderr
    for gone in ("models/gpt3", "strategies/deepspeed", "launch/kubeflow", "launch/tione", "launch/slurm"):
        assert not (package / gone).exists(), f"{gone} is still in the project after the update"
    for gone in ("strategies/deepspeed.py", "launch/deepspeed_launcher.py", "cluster/ray_train.py", "data/masked.py"):
        assert not (package / gone).exists(), f"{gone} is still in the project after the update"
    said = update.stdout + update.stderr
    assert f"kept src/{SLUG}/models/bert/: the project is no longer made with it, and you edited model.py" in said
    assert "USER_BERT = 1" in (package / "models/bert/model.py").read_text()  # the edited part stays whole
    assert (package / "models/bert/descriptor.py").is_file()
    assert f"removed src/{SLUG}/models/gpt3/" in said and f"removed src/{SLUG}/launch/kubeflow/" in said
    assert "USER_MARK = 'kept'" in (package / "settings/topology.py").read_text()
    assert (package / "launch/devmachine/platform.py").is_file() and not list(project.rglob("*.rej"))
    assert check(project).returncode == 0
    refused = check_with(project, "run.strategy=deepspeed")
    assert refused.returncode == 1 and "`copier update --data strategy=deepspeed`" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    shutil.rmtree(package / "models/bert")  # the user is done with it
    commit_all(project, "update to the chosen parts")

    add = copier(project, "update", "--defaults", "--trust", "--conflict", "inline", "--data", "strategy=deepspeed")
    assert add.returncode == 0, add.stdout + add.stderr
    assert (package / "strategies/deepspeed/engine.py").is_file() and (project / "tests/test_deepspeed.py").is_file()
    assert yaml.safe_load((project / "config/train.yaml").read_text())["run"]["strategy"] == "deepspeed"
    assert check(project).returncode == 0
    collected = run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "part", "-p", "no:cacheprovider"],
        cwd=project,
        env={"PYTHONPATH": str(project / "src")},
    )
    assert "tests/test_deepspeed.py::" in collected.stdout, collected.stdout[-2000:]


def check_with(project: Path, *overrides: str):
    return run([sys.executable, "-m", SLUG, "check", *overrides], cwd=project, env={"PYTHONPATH": str(project / "src")})

"""The template works from a git URL, and `copier update` re-renders a project from its answers: from
an untagged history, as users get main (tests/test_update.py has tagged releases and migrations)."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from conftest import BIN, TEMPLATE, copier_copy, git, run


def snapshot_template(dst: Path) -> Path:
    """A git repository holding the template's working tree (uncommitted changes included), untagged."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard"], cwd=TEMPLATE).stdout.split("\n")
    for rel in filter(None, listed):
        src = TEMPLATE / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    git(dst, "init", "-q", "-b", "main")
    git(dst, "add", "-A")
    git(dst, "commit", "-qm", "template")
    return dst


def short_head(repo: Path) -> str:
    """The commit as copier records it without a tag (`git describe --tags --always`)."""
    return git(repo, "rev-parse", "--short", "HEAD").strip()


def test_copy_from_git_url_then_update(tmp_path):
    tpl = snapshot_template(tmp_path / "template")
    project = tmp_path / "project"
    result = copier_copy(project, {"project_name": "Git Run"}, src=f"git+file://{tpl}")
    assert result.returncode == 0, result.stdout + result.stderr
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["_src_path"] == f"git+file://{tpl}"
    assert answers["_commit"] == short_head(tpl)
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "generated")

    # A user edit, then a template change: the next commit, no tag.
    cfg_path = project / "config/train.yaml"
    cfg_path.write_text(cfg_path.read_text().replace("lr: 0.0003", "lr: 0.0006"))
    git(project, "commit", "-qam", "tune lr")
    readme = tpl / "template/README.md.jinja"
    readme.write_text(readme.read_text() + "\nTemplate note added in the next commit.\n")
    git(tpl, "commit", "-qam", "template change")
    # check-update (the generated CI's template job) sees the newer commit: --quiet exits 2.
    outdated = run([str(BIN / "copier"), "check-update", "--quiet"], cwd=project)
    assert outdated.returncode == 2, outdated.stdout + outdated.stderr

    update = run([str(BIN / "copier"), "update", "--trust", "--defaults", "--data", "nodes=2"], cwd=project)
    assert update.returncode == 0, update.stdout + update.stderr
    assert "Template note added in the next commit." in (project / "README.md").read_text()
    cfg = yaml.safe_load(cfg_path.read_text())
    assert cfg["optim"]["lr"] == 0.0006, "the user's edit was lost"
    assert cfg["cluster"]["nodes"] == 2
    assert "for 16 processes" in (project / "README.md").read_text()
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == short_head(tpl)

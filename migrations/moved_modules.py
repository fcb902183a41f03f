"""Keep a user's edits to project files that a template update moves or removes (copier.yml `_migrations`).

`copier update` deletes every file the project's template commit wrote that the new commit no longer
writes at that path, edited or not: the user's edit would be lost without a word. Run on every
update (copier runs it whatever the two commits are, tagged or not), in the project's root:

    python migrations/moved_modules.py save TEMPLATE_CLONE OLD_REF [NEW_ANSWERS_JSON]   (before the update)
        the files the template wrote at OLD_REF that its clone at the new commit no longer writes
        and that the project still holds: where one differs from what OLD_REF wrote (the user
        edited it), both versions are kept in the project's git folder, and the user's file is set
        back to the template's (in the index too), so copier's own diff holds no edit to a path
        it is about to remove
    python migrations/moved_modules.py restore                        (after the update)
        each kept edit goes to the file's new home (MOVED): merged in with git merge-file (the
        template's old version is the base, so only the user's changes move; a clash is marked
        inline and named). A file merged into a larger one cannot take a three-way merge, and a
        removed file has no home: the user's changes are written as a diff (beside the new home,
        or at the old path) and a line names it.

What was written at OLD_REF is found by rendering that commit with copier (only when the project
holds a file the new commit drops), so a file rendered from Jinja counts as edited only where the
user changed it. Idempotent: save again keeps what it kept (the user's file was set back by the first
run); with nothing kept, restore does nothing; a save for another OLD_REF drops what an earlier,
unfinished update kept.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jinja2
import yaml

ANSWERS = Path(".copier-answers.yml")
PACKAGE = "{package}"  # in MOVED: the project's src/<project_slug>

# Old path -> new path, inside src/<package>/. "+" marks a module merged into another one.
MOVED = {
    "config.py": "settings/config.py",
    "bounds.py": "settings/bounds.py",
    "rules.py": "planning/rules.py",
    "settings/rules.py": "planning/rules.py",
    "gpus.py": "settings/gpus.py",
    "sizes.py": "+models/gpt3/descriptor.py",  # the families' tables went to their descriptors
    "settings/sizes.py": "+models/gpt3/descriptor.py",
    "precision.py": "settings/precision.py",
    "topology.py": "settings/topology.py",
    "project.py": "+settings/config.py",
    "env_files.py": "+settings/config.py",
    "data.py": "data/tokens.py",
    "mlm_data.py": "models/bert/data.py",
    "splits.py": "+models/bert/data.py",
    "documents.py": "data/documents.py",
    "encode_parts.py": "data/encode_parts.py",
    "encode_workers.py": "data/encode_workers.py",
    "staging.py": "data/staging.py",
    "progress.py": "data/progress.py",
    "demo_corpus.py": "data/demo_corpus.py",
    "prepare_data.py": "data/prepare_data.py",
    "distributed.py": "runtime/distributed.py",
    "unrecoverable.py": "runtime/unrecoverable.py",
    "faults.py": "runtime/faults.py",
    "runtime/interrupts.py": "+runtime/process_exit.py",
    "runtime/optional_packages.py": "+settings/packages.py",
    "checkpoint.py": "checkpoints/checkpoint.py",
    "checkpoint_files.py": "checkpoints/checkpoint_files.py",
    "strategies/compilation.py": "+strategies/common.py",
    "strategies/grad_norm.py": "+strategies/common.py",
    "strategies/param_groups.py": "+strategies/common.py",
    "train.py": "training/train.py",
    "prefetch.py": "training/prefetch.py",
    "metrics.py": "training/metrics.py",
    "run_lock.py": "training/run_lock.py",
    "preemption.py": "training/preemption.py",
    "evaluate.py": "evaluation/evaluate.py",
    "sample.py": "evaluation/sample.py",
    "trained_model.py": "evaluation/trained_model.py",
    "estimates.py": "planning/estimates.py",
    "fit.py": "planning/fit.py",
    "scaling.py": "planning/scaling.py",
    "plan.py": "planning/plan.py",
    "check_project.py": "planning/check.py",
    "network.py": "cluster/network.py",
    "local_ranks.py": "cluster/local_ranks.py",
    "torchrun.py": "cluster/torchrun.py",
    "rendezvous.py": "cluster/rendezvous.py",
    "supervise.py": "cluster/supervise.py",
    "node.py": "cluster/node.py",
    "nccl_env.py": "cluster/nccl_env.py",
    "ray_train.py": "launch/tione/ray_train.py",
    "doctor.py": "diagnostics/doctor.py",
    "allreduce_bench.py": "diagnostics/allreduce_bench.py",
    "nccl_log.py": "diagnostics/nccl_log.py",
    "nccl_verdict.py": "diagnostics/nccl_verdict.py",
    "fabric.py": "diagnostics/fabric.py",
    "node_checks.py": "diagnostics/node_checks.py",
    "rdma.py": "diagnostics/rdma.py",
    "rank_stacks.py": "diagnostics/rank_stacks.py",
    "debug_dump.py": "diagnostics/debug_dump.py",
    "verdicts.py": "+diagnostics/__init__.py",
    "image.py": "image/build.py",
    "image_plan.py": "image/plan.py",
    # the flat launch modules became the launch/ package (rewritten, so merged rather than moved)
    "launch.py": "+launch/__init__.py",
    "launch_slurm.py": "+launch/slurm/platform.py",
    "launch_tione.py": "+launch/tione/platform.py",
    "launch_kubeflow.py": "launch/kubeflow/platform.py",
    "launch_kubeflow_restarts.py": "launch/kubeflow/restarts.py",
    "launch_deepspeed.py": "strategies/deepspeed/launcher.py",
    # 0.5.0: a folder per model family, checkpoints in one folder, a folder per launch platform
    "models/gpt.py": "models/gpt/model.py",
    "models/gpt_family.py": "models/gpt/descriptor.py",
    "models/gpt_build.py": "models/gpt/build.py",
    "models/gpt_pieces.py": "models/gpt/pieces.py",
    "models/gpt_transformers.py": "models/gpt/export.py",
    "models/gpt3.py": "models/gpt3/model.py",
    "models/gpt3_family.py": "models/gpt3/descriptor.py",
    "models/bert.py": "models/bert/model.py",
    "models/bert_family.py": "models/bert/descriptor.py",
    "runtime/checkpoint.py": "checkpoints/checkpoint.py",
    "runtime/checkpoint_files.py": "checkpoints/checkpoint_files.py",
    "strategies/universal_checkpoint.py": "strategies/deepspeed/universal_checkpoint.py",
    "launch/deepspeed.py": "strategies/deepspeed/launcher.py",
    "launch/kubeflow.py": "launch/kubeflow/platform.py",
    "launch/kubeflow_cluster.py": "launch/kubeflow/kubernetes_api.py",
    "launch/kubeflow_restarts.py": "launch/kubeflow/restarts.py",
    "launch/tione.py": "launch/tione/platform.py",
    "launch/tione_console.py": "launch/tione/console.py",
    "launch/tione_request.py": "launch/tione/request.py",
    # The optional parts each in its folder, written only where the project was made with them.
    "strategies/deepspeed.py": "strategies/deepspeed/engine.py",
    "strategies/pipeline.py": "strategies/deepspeed/pipeline.py",
    "strategies/tensor_parallel.py": "strategies/deepspeed/tensor_parallel.py",
    "checkpoints/universal_checkpoint.py": "strategies/deepspeed/universal_checkpoint.py",
    "launch/deepspeed_launcher.py": "strategies/deepspeed/launcher.py",
    "data/masked.py": "models/bert/data.py",
    "launch/slurm.py": "launch/slurm/platform.py",
    "planning/slurm_partition.py": "launch/slurm/partition.py",
    "launch/devmachine.py": "launch/devmachine/platform.py",
    "cluster/ray_train.py": "launch/tione/ray_train.py",
}
# The same for files outside the package, by their path in the project.
MOVED_IN_PROJECT = {
    "launch/devmachine/cpu-smoke.sh": "scripts/cpu-smoke.sh",
    "tests/conftest.py": "conftest.py",  # the fixtures moved up beside the families' own tests
    "tests/test_bert.py": f"{PACKAGE}/models/bert/tests/test_bert.py",
    "tests/test_bert_input.py": f"{PACKAGE}/models/bert/tests/test_bert_input.py",
    "tests/test_gpt3.py": f"{PACKAGE}/models/gpt3/tests/test_gpt3.py",
}
PATH_JINJA = jinja2.Environment(autoescape=False, keep_trailing_newline=True)


def git(*args: str, cwd: Path | str = ".", check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def load_answers() -> dict:
    answers = yaml.safe_load(ANSWERS.read_text()) if ANSWERS.is_file() else None
    return answers if isinstance(answers, dict) else {}


def kept_folder() -> Path:
    """Inside the project's git folder (a worktree's or a monorepo's too): never part of its tree or copier's diff."""
    return Path(git("rev-parse", "--git-path", "moved-module-edits").stdout.strip())


def home_of(path: str, package: str) -> str | None:
    """The project path an edit of PATH goes to ("+" first: merged into that file), None when removed."""
    prefix = f"{package}/"
    if path.startswith(prefix) and path[len(prefix) :] in MOVED:
        new = MOVED[path[len(prefix) :]]
        return ("+" if new.startswith("+") else "") + prefix + new.lstrip("+")
    new = MOVED_IN_PROJECT.get(path)
    return new.replace(PACKAGE, package) if new else None


def template_settings(copier_yml: str) -> tuple[str, str]:
    """The folder the template's files live in and the suffix of its Jinja files, from its copier.yml."""

    def setting(name: str, default: str) -> str:
        found = re.search(rf"^_{name}:[ \t]*[\"']?([^\"'\s#]*)", copier_yml, re.M)
        return found.group(1) if found else default

    return setting("subdirectory", "").strip("/"), setting("templates_suffix", ".jinja")


def written_paths(clone: str, ref: str, answers: dict) -> set[str]:
    """The project paths the template at REF writes with these answers: its file names rendered as
    copier renders them (a part that renders empty is not written; a name these answers cannot render
    is left out, so at worst a file is kept that copier writes again, and restore merges it back)."""
    shown = (git("show", f"{ref}:{name}", cwd=clone, check=False) for name in ("copier.yml", "copier.yaml"))
    copier_yml = next((found.stdout for found in shown if found.returncode == 0), "")
    subdirectory, suffix = template_settings(copier_yml)
    listed = git("ls-tree", "-r", "--name-only", ref, "--", subdirectory or ".", cwd=clone).stdout
    context = {**answers, "_copier_conf": {"answers_file": str(ANSWERS)}}
    paths = set()
    for raw in listed.splitlines():
        relative = raw[len(subdirectory) + 1 :] if subdirectory else raw
        try:
            parts = [PATH_JINJA.from_string(part).render(context) for part in relative.split("/")]
        except jinja2.TemplateError:
            continue
        if all(parts):
            path = "/".join(parts)
            paths.add(path[: -len(suffix)] if suffix and path.endswith(suffix) else path)
    return paths


def rendered_paths(template_clone: str, answers: dict) -> set[str]:
    """The project paths the new commit writes with the update's answers, rendered by copier: its file
    names and its `_exclude` (a project holds only the family, strategy and platforms it was made with)."""
    with tempfile.TemporaryDirectory(prefix="new-render-") as new_render:
        try:
            render_at("HEAD", {**answers, "_src_path": template_clone}, Path(new_render))
        except Exception as error:  # copier's own errors have no common base; nothing is changed yet
            raise SystemExit(f"migration: cannot render the new template to find what it drops: {error}") from None
        return {p.relative_to(new_render).as_posix() for p in Path(new_render).rglob("*") if p.is_file()}


def render_at(ref: str, answers: dict, into: Path) -> None:
    """The project as the template at REF wrote it, as copier renders the old side of an update."""
    from copier import run_copy  # the copier running this update

    run_copy(
        src_path=answers["_src_path"],
        dst_path=into,
        data={key: value for key, value in answers.items() if not key.startswith("_")},
        vcs_ref=ref,
        defaults=True,
        overwrite=True,
        quiet=True,
        skip_tasks=True,
        unsafe=True,
    )


def part_folder(path: str) -> str | None:
    """The optional part a path of the package belongs to (src/<package>/models/bert, .../launch/slurm,
    .../strategies/deepspeed), None for any other path."""
    parts = path.split("/")
    if len(parts) > 4 and parts[0] == "src" and parts[2] in ("models", "launch", "strategies"):
        return "/".join(parts[:4])
    return None


def as_answered(given, recorded):
    """An answer given with --data (text) in the type of the recorded one: a list of platforms."""
    if isinstance(recorded, list) and isinstance(given, str):
        return [item.strip(" '\"") for item in given.strip().strip("[]").split(",") if item.strip(" '\"")]
    return given


def save(template_clone: str, old_ref: str, new_answers: str = "{}") -> None:
    """new_answers: the answers given to this update (--data), as JSON."""
    kept = kept_folder()
    stamp = kept / "old_ref"
    if not (stamp.is_file() and stamp.read_text() == old_ref):  # left by an update that did not finish
        shutil.rmtree(kept, ignore_errors=True)
    answers = load_answers()
    new = {**answers, **{k: as_answered(v, answers.get(k)) for k, v in json.loads(new_answers).items()}}
    old_paths = {path for path in written_paths(template_clone, old_ref, answers) if Path(path).is_file()}
    new_rendered = rendered_paths(template_clone, new)
    named = written_paths(template_clone, "HEAD", new)
    # A file whose path the new commit still names but no longer writes for these answers (a part the
    # project is not made with, left out by _exclude): copier leaves it alone, so restore removes it.
    unused = sorted(path for path in old_paths & named - new_rendered if part_folder(path))
    candidates = sorted(path for path in old_paths - named if Path(path) != ANSWERS)
    if not candidates and not unused:
        return
    kept.mkdir(parents=True, exist_ok=True)
    stamp.write_text(old_ref)
    saved = []
    with tempfile.TemporaryDirectory(prefix="old-render-") as old_render:
        try:
            render_at(old_ref, answers, Path(old_render))
        except Exception as error:  # copier's own errors have no common base; nothing is changed yet
            why = f"migration: cannot render the template at {old_ref} to find your edits: {error}"
            raise SystemExit(why) from None
        edited = {path for path in unused if Path(old_render, path).read_bytes() != Path(path).read_bytes()}
        folders = {}
        for path in unused:
            folders.setdefault(part_folder(path), []).append(path)
        (kept / "unused.json").write_text(
            json.dumps(
                {folder: {"files": files, "edited": sorted(edited & set(files))} for folder, files in folders.items()}
            )
        )
        for path in candidates:
            written = Path(old_render, path)
            if not written.is_file():
                continue  # not the template's at OLD_REF: the user's own file, which copier leaves alone
            base, yours = written.read_bytes(), Path(path).read_bytes()
            folder = kept / hashlib.sha1(path.encode()).hexdigest()[:16]
            if base == yours:
                continue  # unedited, or set back by an earlier save of this update
            folder.mkdir(exist_ok=True)
            (folder / "base").write_bytes(base)
            (folder / "yours").write_bytes(yours)
            (folder / "where.json").write_text(json.dumps({"path": path}))
            Path(path).write_bytes(base)  # copier now sees no edit to a path the new commit drops
            git("add", "--", path)
            saved.append(path)
    if saved:
        print(f"edited files this update moves or removes (your edits are placed after it): {', '.join(saved)}")


def write_diff(folder: Path, path: str, patch: Path) -> None:
    def lines(name: str) -> list[str]:
        return (folder / name).read_bytes().decode("utf-8", errors="replace").splitlines(True)

    patch.parent.mkdir(parents=True, exist_ok=True)
    patch.write_text("".join(difflib.unified_diff(lines("base"), lines("yours"), path, path)))


def remove_unused_parts(kept: Path) -> None:
    """The folders of the parts the project is no longer made with: removed where the user edited
    none of their files, kept and named otherwise."""
    listed = kept / "unused.json"
    if not listed.is_file():
        return
    for folder, found in json.loads(listed.read_text()).items():
        if found["edited"]:
            edited = ", ".join(Path(path).name for path in found["edited"])
            print(f"kept {folder}/: the project is no longer made with it, and you edited {edited}; delete the "
                  "folder when you are done with it (`copier update --data ...` brings the part back)")  # fmt: skip
            continue
        for path in found["files"]:
            Path(path).unlink(missing_ok=True)
        for cache in sorted(Path(folder).rglob("__pycache__"), reverse=True) if Path(folder).is_dir() else []:
            shutil.rmtree(cache, ignore_errors=True)
        for child in (
            sorted((p for p in Path(folder).rglob("*") if p.is_dir()), reverse=True) if Path(folder).is_dir() else []
        ):
            if not any(child.iterdir()):
                child.rmdir()
        if Path(folder).is_dir() and not any(Path(folder).iterdir()):
            Path(folder).rmdir()
            print(f"removed {folder}/: the project is not made with it")


def restore() -> int:
    kept = kept_folder()
    if not kept.is_dir():
        return 0
    remove_unused_parts(kept)
    package = f"src/{load_answers().get('project_slug', '')}"
    clashes = []
    for folder in sorted(p for p in kept.iterdir() if p.is_dir()):
        path = json.loads((folder / "where.json").read_text())["path"]
        home = path if Path(path).is_file() else home_of(path, package)  # written again: the edit goes back
        if home is None:
            patch = Path(f"{path}.diff")
            write_diff(folder, path, patch)
            print(f"{path} is no longer part of the template: your edits to it are kept in {patch}")
            continue
        target = Path(home.lstrip("+"))
        if not target.is_file():
            patch = Path(f"{path}.diff")
            write_diff(folder, path, patch)
            print(f"{path} moved to {target}, which this project does not hold: your edits to it are kept in {patch}")
            continue
        if home.startswith("+"):
            patch = target.with_name(f"{target.name}.{Path(path).stem}.diff")
            write_diff(folder, path, patch)
            print(f"{path} is now part of {target}: apply your edits there by hand; they are in {patch}")
            continue
        result = git("merge-file", "-L", "after updating", "-L", f"{path} before updating", "-L", f"your {path}",
                     str(target), str(folder / "base"), str(folder / "yours"), check=False)  # fmt: skip
        if result.returncode < 0 or result.returncode > 127:
            print(f"could not merge your edits to {path} into {target}: {result.stderr.strip()}", file=sys.stderr)
            return 1
        if result.returncode:
            clashes.append(str(target))
        print(f"your edits to {path} now live in {target}")
    shutil.rmtree(kept)
    if clashes:
        print(f"edits that clash with the new template are marked inline (<<<<<<<) in: {', '.join(clashes)}")
    return 0


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["save"] and len(argv) in (3, 4):
            save(*argv[1:])
            return 0
        if argv == ["restore"]:
            return restore()
    except subprocess.CalledProcessError as error:  # save stops before it sets back any file
        print(f"migration: {' '.join(error.cmd)} failed: {error.stderr.strip()}", file=sys.stderr)
        return 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

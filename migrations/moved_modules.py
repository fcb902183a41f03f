"""Keep a user's edits to package modules that a template release moved (copier.yml `_migrations`).

`copier update` removes a module that the new template no longer has at that path, edited or not;
the user's edit would be lost. Run on every update, in the project's root:

    python migrations/moved_modules.py save TEMPLATE_CLONE OLD_REF    (before the update)
        every module of MOVED that the project has and the user edited (it differs from the template
        at OLD_REF): the template's version and the user's are kept under .git/, and the user's
        file is set back to the template's (in the index too), so copier's own diff holds no edit
        to a path it is about to remove
    python migrations/moved_modules.py restore                        (after the update)
        each kept edit is merged into the module's new home (git merge-file: the template's old
        version is the base, so only the user's changes move; a clash is marked inline and named).
        A module merged into a larger one cannot take a three-way merge: the user's changes are
        written beside it as <new home>.<old name>.diff, and a line says so.

Idempotent: with nothing kept, restore does nothing. An update across several releases that moved
modules runs save once per release, with the same OLD_REF: what the first run kept stays (the user's
file was set back by it), and MOVED names each module's newest home, so one restore merges every
edit where the module lives now. A save for another OLD_REF overwrites what an earlier update kept.
"""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

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
    "mlm_data.py": "data/masked.py",
    "splits.py": "+data/masked.py",
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
    "ray_train.py": "cluster/ray_train.py",
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
    "strategies/universal_checkpoint.py": "checkpoints/universal_checkpoint.py",
    "launch/deepspeed.py": "launch/deepspeed_launcher.py",
    "launch/kubeflow.py": "launch/kubeflow/platform.py",
    "launch/kubeflow_cluster.py": "launch/kubeflow/kubernetes_api.py",
    "launch/kubeflow_restarts.py": "launch/kubeflow/restarts.py",
    "launch/tione.py": "launch/tione/platform.py",
    "launch/tione_console.py": "launch/tione/console.py",
    "launch/tione_request.py": "launch/tione/request.py",
}
KEPT = Path(".git/moved-module-edits")  # inside .git: never part of the project's tree or copier's diff
TEMPLATE_PACKAGE = "template/src/{{project_slug}}"


def git(*args: str, cwd: Path | str = ".", check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def package_dir() -> Path:
    answers = yaml.safe_load(Path(".copier-answers.yml").read_text()) or {}
    return Path("src") / answers["project_slug"]


def save(template_clone: str, old_ref: str) -> None:
    stamp = KEPT / "old_ref"
    if not (stamp.is_file() and stamp.read_text() == old_ref):  # kept by an earlier update: not this one's
        shutil.rmtree(KEPT, ignore_errors=True)
    KEPT.mkdir(parents=True, exist_ok=True)
    stamp.write_text(old_ref)
    package = package_dir()
    kept = []
    for old, new in MOVED.items():
        path = package / old
        if not path.is_file() or (KEPT / old.replace("/", "__")).is_dir():
            continue
        shown = git("show", f"{old_ref}:{TEMPLATE_PACKAGE}/{old}", cwd=template_clone, check=False)
        if shown.returncode != 0:
            continue  # not a template module at that release: the user's own, which copier leaves alone
        base, yours = shown.stdout, path.read_text()
        if base == yours:
            continue
        folder = KEPT / old.replace("/", "__")
        folder.mkdir(parents=True)
        (folder / "base").write_text(base)
        (folder / "yours").write_text(yours)
        (folder / "where.json").write_text(json.dumps({"old": old, "new": new}))
        path.write_text(base)  # copier now sees no edit to a path the new release removes
        git("add", "--", str(path))
        kept.append(old)
    if kept:
        print(
            f"modules this release moves, with your edits (merged into their new homes after the update): {', '.join(kept)}"
        )


def restore() -> int:
    if not KEPT.is_dir():
        return 0
    package = package_dir()
    clashes = []
    for folder in sorted(p for p in KEPT.iterdir() if p.is_dir()):
        where = json.loads((folder / "where.json").read_text())
        old, new = where["old"], where["new"]
        merged = new.startswith("+")
        target = package / new.lstrip("+")
        if merged or not target.is_file():
            patch = (
                target.with_name(f"{target.name}.{Path(old).stem}.diff")
                if target.parent.is_dir()
                else package / f"{old}.diff"
            )
            base, yours = (folder / "base").read_text(), (folder / "yours").read_text()
            patch.write_text("".join(difflib.unified_diff(base.splitlines(True), yours.splitlines(True), old, old)))
            print(f"{old} is now part of {target}: apply your edits there by hand; they are in {patch}")
            continue
        result = git("merge-file", "-L", "after updating", "-L", f"{old} before updating", "-L", f"your {old}",
                     str(target), str(folder / "base"), str(folder / "yours"), check=False)  # fmt: skip
        if result.returncode < 0 or result.returncode > 127:
            print(f"could not merge your edits to {old} into {target}: {result.stderr.strip()}", file=sys.stderr)
            return 1
        if result.returncode:
            clashes.append(str(target))
        print(f"your edits to {old} now live in {target}")
    shutil.rmtree(KEPT)
    if clashes:
        print(f"edits that clash with the new release are marked inline (<<<<<<<) in: {', '.join(clashes)}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["save"] and len(argv) == 3:
        save(argv[1], argv[2])
        return 0
    if argv == ["restore"]:
        return restore()
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

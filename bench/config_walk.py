"""The config's walk through `train`: a tiny run in this process under sys.setprofile (CPU, one process).

    python bench/config_walk.py --project /tmp/proj [--data DIR] [KEY=VALUE ...]

Records every call into the generated package whose arguments hold the Config, or an object carrying
it as .cfg (the Run); a strategy's own methods (self) do not count. Prints the modules the config
enters, the folders it enters (one entry per distinct caller -> callee edge that crosses a folder: a
loop repeating an edge adds nothing), the returns to a lower folder the walk had already entered
(the layering the issue asks to be one pass down), and each resolver's call sites
(resolve_precision, Config.data_parallel_size, family). --data: prepared data (default: the demo
corpus, prepared into a temporary folder).
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
from pathlib import Path

TIERS = ["settings", "models", "data", "runtime", "checkpoints", "strategies", "planning", "evaluation", "training"]
RESOLVERS = ("resolve_precision", "data_parallel_size", "family")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--project", type=Path, required=True, help="a generated project")
    p.add_argument("--data", type=Path, help="prepared data (default: the demo corpus, prepared now)")
    p.add_argument("overrides", nargs="*", help="config overrides for the run")
    args = p.parse_args()
    package_dir = next(path.parent for path in (args.project / "src").glob("*/cli.py"))
    work = Path(tempfile.mkdtemp(prefix="config-walk-"))
    data = args.data or prepare_demo(args.project, package_dir.name, work / "data")
    sys.path.insert(0, str(args.project / "src"))
    config = importlib.import_module(f"{package_dir.name}.settings.config")
    train = importlib.import_module(f"{package_dir.name}.training.train")
    walk = Walk(package_dir, config.Config)
    cfg = config.load_config(args.project / "config" / "train.yaml", [*OVERRIDES, f"data.dir={data}",
                             f"run.output_dir={work / 'runs'}", *args.overrides])  # fmt: skip
    sys.setprofile(walk.profile)
    try:
        code = train.run_training(cfg)
    finally:
        sys.setprofile(None)
    if code:
        sys.exit(f"the run ended with exit {code}")
    walk.report()


def prepare_demo(project: Path, package: str, data: Path) -> Path:
    command = [sys.executable, "-m", package, "prepare-data", "--demo-corpus", f"data.dir={data}",
               "data.vocab_size=2048", "data.val_fraction=0.05"]  # fmt: skip
    subprocess.run(command, cwd=project, env={"PYTHONPATH": str(project / "src"), "PATH": "/usr/bin:/bin"},
                   check=True, capture_output=True)  # fmt: skip
    return data


OVERRIDES = [
    "model.arch=gpt", "model.pretrained=", "model.size=tiny", "model.n_kv_head=null", "model.sequence_len=64",
    "batch.global_batch_size=16", "batch.micro_batch_size=4", "batch.grad_accum_steps=null",
    "schedule.max_steps=4", "schedule.warmup_steps=1", "logging.every_steps=2", "logging.eval_every_steps=0",
    "logging.eval_batches=2", "logging.tensorboard=false", "checkpoint.every_steps=2", "checkpoint.resume=false",
    "run.device=cpu", "run.dtype=fp32", "run.compile=false", "data.rows=windows", "data.vocab_size=2048",
]  # fmt: skip


def folder(function: str) -> str:
    return function.split(".")[0]


def tier(function: str) -> int:
    return TIERS.index(folder(function)) if folder(function) in TIERS else len(TIERS)


class Walk:
    """The calls that carry the config, recorded by a profile function."""

    def __init__(self, package_dir: Path, config_type: type):
        self.package_dir, self.config_type = package_dir, config_type
        self.calls: list[tuple[str | None, str]] = []  # (caller, callee) as module.function
        self.resolver_sites: dict[str, set[str]] = {}
        self.stack: list[tuple[object, str]] = []  # package frames that hold the config
        self.chain_problems: set[str] = set()  # calls that go up a tier, or back into a folder the chain left

    def module_of(self, filename: str) -> str | None:
        try:
            return ".".join(Path(filename).relative_to(self.package_dir).with_suffix("").parts)
        except ValueError:
            return None

    def carries_config(self, name: str, value) -> bool:
        if isinstance(value, self.config_type):
            return True
        if name == "self":
            return False
        try:
            return isinstance(value.__dict__.get("cfg"), self.config_type)
        except (AttributeError, TypeError):
            return False

    def profile(self, frame, event, arg):
        if event == "return":
            if self.stack and self.stack[-1][0] is frame:
                self.stack.pop()
            return
        if event != "call":
            return
        code = frame.f_code
        module = self.module_of(code.co_filename)
        if module is None:
            return
        function = f"{module}.{code.co_name}"
        if code.co_name in RESOLVERS and frame.f_back is not None:
            caller = self.module_of(frame.f_back.f_code.co_filename)
            if caller:
                self.resolver_sites.setdefault(code.co_name, set()).add(f"{caller}:{frame.f_back.f_lineno}")
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(self.carries_config(name, frame.f_locals.get(name)) for name in names):
            caller = self.stack[-1][1] if self.stack else None
            self.calls.append((caller, function))
            self.judge_chain([f for _, f in self.stack], function)
            self.stack.append((frame, function))

    def judge_chain(self, chain: list[str], callee: str) -> None:
        """One call chain should only go down: a call into a higher tier (a callback), or into a folder
        the chain has already left for a lower one, is the config's walk turning back."""
        if not chain:
            return
        caller = chain[-1]
        if tier(callee) > tier(caller):
            self.chain_problems.add(f"up: {caller} -> {callee}")
        left = {folder(f) for f in chain[:-1]} - {folder(caller)}
        if folder(callee) in left and folder(callee) != folder(caller):
            self.chain_problems.add(f"back: {' -> '.join([*chain, callee])}")

    def report(self) -> None:
        modules = sorted({callee.rsplit(".", 1)[0] for _, callee in self.calls})
        edges, seen = [], set()
        for caller, callee in self.calls:
            if caller is None or folder(caller) == folder(callee) or (caller, callee) in seen:
                continue
            seen.add((caller, callee))
            edges.append((caller, callee))
        entered, returns = {"training": 1}, []
        for caller, callee in edges:
            if folder(callee) in entered and tier(callee) < tier(caller):
                returns.append(f"{caller} -> {callee}")
            entered[folder(callee)] = entered.get(folder(callee), 0) + 1
        order = sorted(entered.items(), key=lambda item: TIERS.index(item[0]) if item[0] in TIERS else len(TIERS))
        print(f"modules entered with the config: {len(modules)}")
        print("  " + ", ".join(modules))
        print(f"folder entries (distinct crossing call edges): {len(edges)}")
        print("  " + " | ".join(f"{name} {count}" for name, count in order))
        print(f"returns to a lower folder already entered: {len(returns)}")
        for line in returns:
            print("  " + line)
        print(
            f"calls along one chain that turn back (up a tier, or into a folder the chain left): {len(self.chain_problems)}"
        )
        for line in sorted(self.chain_problems):
            print("  " + line)
        print("resolver call sites during the run:")
        for name, sites in sorted(self.resolver_sites.items()):
            print(f"  {name}: {len(sites)}: {', '.join(sorted(sites))}")


if __name__ == "__main__":
    main()

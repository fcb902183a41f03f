"""Cross-field checks of template answers, before anything is written.

    from answers import problems
    problems({"model": "gpt3", "model_size": "13B", "gpu_type": "v100-16gb", ...})
    # -> ["gpu_type=v100-16gb: does not fit: ...; smallest change: ..."]

    python hooks/answers.py '{"nodes": 2, "gpus_per_node": 8}'   # prints the problems, exit 1 if any

Used by copier's validators (hooks/copier_extension.py) and by cookiecutter's pre_gen hook. The
rules are NOT written here: answers are rendered into config/train.yaml exactly as the template
does (template/config/train.yaml.jinja), loaded with the generated package's config.load_config,
and checked with its rules.check_config and plan.fit_problem -- the same code `<slug> check` and
train start run. The package is loaded from template/src/{{project_slug}}/ by file path.
Only rules between answers that never reach train.yaml (Kubernetes names, platform needs) live here.
Each problem is one line: "<answer>=<value>: <why>; <what to do>".
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import tempfile
from pathlib import Path

import jinja2

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "template"
PACKAGE_DIR = TEMPLATE / "src" / "{{project_slug}}"
# One module name per template checkout: `copier update` loads the old and the new version side by side.
PACKAGE = "dtt_rules_pkg_" + hashlib.sha256(str(PACKAGE_DIR).encode()).hexdigest()[:12]

# Answers that shape train.yaml, with copier.yml's defaults for the ones a caller leaves out.
DEFAULTS = {
    "project_name": "My Training Run", "project_slug": "run", "model": "gpt", "gpt3_layout": "125m-1gpu",
    "pretrained_dir": "", "platforms": ["devmachine"], "shared_mount": "/mnt/shared",
    "data_dir": "/mnt/shared/run/data", "output_dir": "/mnt/shared/run/runs",
}

# Which answer a config key in a rule's message comes from (first key named wins).
CONFIG_TO_ANSWER = [
    ("parallel.tensor", "tensor_parallel"), ("parallel.pipeline", "pipeline_parallel"),
    ("deepspeed.zero_stage", "zero_stage"), ("run.strategy", "strategy"),
    ("cluster.nodes", "nodes"), ("cluster.gpus_per_node", "gpus_per_node"), ("cluster.gpu_type", "gpu_type"),
    ("model.pretrained", "pretrained_dir"), ("model.size", "model_size"), ("model.arch", "model"),
    ("batch.", "gpus_per_node"), ("model.", "model_size"),
]

# Pods the operators create from the job name (= project_slug): the longest suffix for `nodes`.
# PyTorchJob: <name>-master-0, <name>-worker-<i>; MPIJob: <name>-launcher, <name>-worker-<i>;
# TrainJob (JobSet): <name>-node-0-<i>-<5 random>. A pod's hostname is a DNS-1123 label (<= 63).
DNS_LABEL = 63


def package():
    """The generated package's pure-Python modules (config, rules, plan, sizes), loaded by path."""
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACKAGE, PACKAGE_DIR / "__init__.py", submodule_search_locations=[str(PACKAGE_DIR)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = module
        spec.loader.exec_module(module)
    return {name: importlib.import_module(f"{PACKAGE}.{name}") for name in ("config", "rules", "fit", "sizes")}


def complete(answers: dict) -> dict:
    """Answers with copier.yml's defaults filled in for train.yaml's inputs a caller left out."""
    a = {**DEFAULTS, **{k: v for k, v in answers.items() if v is not None}}
    layout = package()["sizes"].GPT3_LAYOUTS.get(a["gpt3_layout"], {"size": "125M", "nodes": 1, "gpus_per_node": 8,
                                                                       "tp": 1, "pp": 1})
    gpt3 = a["model"] == "gpt3"
    a.setdefault("model_size", layout["size"] if gpt3 else ("large" if a["model"] == "bert" else "d20"))
    a.setdefault("strategy", "ddp" if a["model"] == "gpt" else "deepspeed")
    a.setdefault("zero_stage", 3 if a["model"] == "bert" else 1)
    a.setdefault("nodes", layout["nodes"] if gpt3 else 1)
    a.setdefault("gpus_per_node", layout["gpus_per_node"] if gpt3 else 8)
    a.setdefault("tensor_parallel", layout["tp"])
    a.setdefault("pipeline_parallel", layout["pp"])
    a.setdefault("gpu_type", "h100-80gb")
    for key in ("nodes", "gpus_per_node", "tensor_parallel", "pipeline_parallel", "zero_stage"):
        a[key] = int(a[key])
    if isinstance(a["platforms"], str):
        a["platforms"] = [p.strip(" '\"") for p in a["platforms"].strip("[]").split(",") if p.strip()]
    return a


def render_train_yaml(answers: dict) -> str:
    """config/train.yaml as the template renders it for these (complete) answers."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string((TEMPLATE / "config" / "train.yaml.jinja").read_text()).render(answers)


# Question order in copier.yml: a problem is blamed on the LAST answer it names, the first
# question at which every input of the rule is known.
QUESTION_ORDER = ["project_name", "project_slug", "model", "gpt3_layout", "model_size", "pretrained_dir", "strategy",
                  "zero_stage", "platforms", "nodes", "gpus_per_node", "tensor_parallel", "pipeline_parallel",
                  "shared_mount", "data_dir", "output_dir", "image", "gpu_type", "pvc_name"]


def _named(message: str) -> set[str]:
    """Answers whose config keys a rule's message names."""
    named = {answer for key, answer in CONFIG_TO_ANSWER if key in message}
    if "batch." in message:  # the data-parallel size comes from the cluster shape
        named |= {"nodes", "gpus_per_node"}
    return named or {"model_size"}


def _field(message: str) -> str:
    """The answer to change: the one the fix names ("set run.strategy=..."), else the last one named."""
    fix = re.search(r"\b(?:set|use) ([a-z_]+\.[a-z_]+)=", message)
    if fix:
        for key, answer in CONFIG_TO_ANSWER:
            if fix.group(1).startswith(key) and key != "batch.":
                return answer
    return max(_named(message), key=QUESTION_ORDER.index)


def _line(a: dict, field: str, message: str) -> str:
    value = a.get(field)
    value = ",".join(value) if isinstance(value, list) else value
    return f"{field}={value}: {' '.join(message.split())}"


def config_problems(a: dict, fit: bool = True) -> list[tuple[str, set[str], str]]:
    """(answer blamed, answers named, message) for every rule the generated config breaks, then plan's memory fit."""
    pkg = package()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.yaml"
        path.write_text(render_train_yaml(a))
        try:
            cfg = pkg["config"].load_config(path)
        except pkg["config"].ConfigError as exc:
            return [(_field(str(exc)), _named(str(exc)), str(exc))]
    found = [(_field(p), _named(p), p) for p in pkg["rules"].check_config(cfg)]
    if not found and fit:
        try:
            problem = pkg["fit"].fit_problem(cfg)
        except pkg["config"].ConfigError as exc:  # a GPU plan does not know
            problem = str(exc)
        if problem:  # blamed on the GPU, asked after everything that shapes the memory
            found.append(("gpu_type", {"gpu_type"}, problem))
    return found


def platform_problems(a: dict) -> list[tuple[str, set[str], str]]:
    """Rules between answers that do not reach train.yaml: Kubernetes names, what a platform needs."""
    found = []
    platforms = a["platforms"]
    if "kubeflow" in platforms:
        last = max(a["nodes"] - 1, 0)
        suffixes = ["-master-0", f"-worker-{last}", f"-node-0-{last}-xxxxx"]
        if a["strategy"] == "deepspeed":
            suffixes.append("-launcher")
        longest = max(suffixes, key=len)
        if len(a["project_slug"]) + len(longest) > DNS_LABEL:
            found.append(("nodes", {"nodes", "project_slug"}, (
                f"the Kubernetes job name '{a['project_slug']}' gives pod names such as "
                f"'{a['project_slug']}{longest}' of {len(a['project_slug']) + len(longest)} characters, over the "
                f"{DNS_LABEL} of a DNS-1123 label; use a slug of at most {DNS_LABEL - len(longest)} characters")))
        if not str(a.get("pvc_name", "x") or "").strip():
            found.append(("pvc_name", {"pvc_name"}, "Kubeflow pods mount the shared storage from a PersistentVolumeClaim; "
                                      "give the name of an existing PVC, e.g. shared-data"))
    return found


def notes(answers: dict) -> list[str]:
    """Things worth knowing that are not errors."""
    a = complete(answers)
    out = []
    if "tione" in a["platforms"] and a.get("fabric", "infiniband") != "tcp":
        out.append("TI-ONE HCC machines inject their own NCCL_IB_* settings; config/nccl.env only sets what "
                   "the platform leaves unset (node applies it with setdefault)")
    return out


def field_problems(answers: dict, fit: bool = True) -> list[tuple[str, set[str], str]]:
    """(answer blamed, answers named, message), platform rules first, then the config rules."""
    a = complete(answers)
    return [(field, named | {field}, message) for field, named, message in platform_problems(a) + config_problems(a, fit)]


def line(answers: dict, field: str, message: str) -> str:
    """One problem as "<answer>=<value>: <why>; <what to do>"."""
    return _line(complete(answers), field, message)


def problems(answers: dict) -> list[str]:
    """Every cross-field problem of a full set of answers, one line each; empty when they are fine."""
    return [line(answers, field, message) for field, _, message in field_problems(answers)]


def main(argv: list[str]) -> int:
    import json

    found = problems(json.loads(argv[0]) if argv else {})
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

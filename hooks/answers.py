"""Cross-field checks of template answers, before anything is written.

    from answers import problems
    problems({"model": "gpt3", "model_size": "13B", "gpu_type": "v100-16gb", ...})
    # -> ["gpu_type=v100-16gb: does not fit: ...; smallest change: ..."]

    python hooks/answers.py '{"nodes": 2, "gpus_per_node": 8}'   # prints the problems, exit 1 if any

Used by copier's validators (hooks/copier_extension.py) and by cookiecutter's pre_gen hook. The
rules are NOT written here: answers are rendered into config/train.yaml exactly as the template
does (template/config/train.yaml.jinja), loaded with the generated package's config.load_config,
and checked with its rules.check_config and fit.fit_problem -- the same code `<slug> check` and
train start run. The package is loaded from template/src/{{project_slug}}/ by file path.
Questions, their order and their defaults are read from copier.yml; a missing answer gets copier's
default, rendered as copier renders it. Each problem names the config keys it concerns and the key
whose change is the fix; CONFIG_ANSWERS turns those into the answer to blame, whatever the wording.
Only rules between answers that never reach train.yaml (Kubernetes names, platform needs) live here.
Each problem is one line: "<answer>=<value>: <why>; <what to do>".

Before any of that, the answers as given (--data, --data-file, cookiecutter's key=value):
given_problems() refuses what copier would drop silently or crash on (unknown names, with the
closest question; derived ones; "two" for a number; values outside the choices), and
question_problems() renders copier.yml's own validators on the completed answers, so that one
line names the first bad answer wherever it came from. reserved_slugs() derives the names
project_slug may not take (the standard library, keywords, what the package imports and requires).
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import importlib
import importlib.util
import json
import keyword
import re
import sys
import tempfile
from pathlib import Path

import jinja2
import jinja2.meta
import yaml

ROOT = Path(__file__).resolve().parents[1]
COPIER_YML = ROOT / "copier.yml"
TEMPLATE = ROOT / "template"
PACKAGE_DIR = TEMPLATE / "src" / "{{project_slug}}"
# One module name per template checkout: `copier update` loads the old and the new version side by side.
PACKAGE = "dtt_rules_pkg_" + hashlib.sha256(str(PACKAGE_DIR).encode()).hexdigest()[:12]

# The answer each config key is rendered from (template/config/train.yaml.jinja). Keys that several
# answers shape (batch sizes, learning rate, schedule) are left out: a problem about them is blamed
# through the other keys it names.
CONFIG_ANSWERS = {
    "model.arch": "model",
    "model.size": "model_size",
    "model.pretrained": "pretrained_dir",
    "run.strategy": "strategy",
    "deepspeed.zero_stage": "zero_stage",
    "cluster.nodes": "nodes",
    "cluster.gpus_per_node": "gpus_per_node",
    "parallel.tensor": "tensor_parallel",
    "parallel.pipeline": "pipeline_parallel",
    "data.dir": "data_dir",
    "run.output_dir": "output_dir",
    "cluster.gpu_type": "gpu_type",
    "batch.scaling": "scaling",
    "batch.global_batch_size": "global_batch_size",
}

# Pods the operators create from the job name (= project_slug): the longest suffix for `nodes`.
# PyTorchJob: <name>-master-0, <name>-worker-<i>; MPIJob: <name>-launcher, <name>-worker-<i>;
# TrainJob (JobSet): <name>-node-0-<i>-<5 random>. A pod's hostname is a DNS-1123 label (<= 63).
DNS_LABEL = 63

# copier adds these filters (regex_search, regex_replace, ...) to every template's environment.
COPIER_EXTENSIONS = ["jinja2_ansible_filters.AnsibleCoreFiltersExtension"]


def package():
    """The generated package's pure-Python modules (config, bounds, batch, rules, fit, the model families), loaded by path."""
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACKAGE, PACKAGE_DIR / "__init__.py", submodule_search_locations=[str(PACKAGE_DIR)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = module
        spec.loader.exec_module(module)
    modules = {
        "config": "settings.config",
        "bounds": "settings.bounds",
        "batch": "settings.batch",
        "rules": "planning.rules",
        "fit": "planning.fit",
        "family": "models.family",
    }
    return {name: importlib.import_module(f"{PACKAGE}.{module}") for name, module in modules.items()}


# --- a family's named layouts (copier's gpt3_layout question), from its descriptor -------------------

CUSTOM_LAYOUT = "custom"


def layouts(model: str) -> dict[str, dict]:
    """The family's presets (size, nodes, gpus_per_node, tp, pp, gpu_type) by name, and 'custom': its
    default size on one node of 8, the answers then asked one by one ({} for a family without presets)."""
    fam = _family(model)
    if fam is None or not fam.presets:
        return {}
    custom = {"size": fam.default_size, "nodes": 1, "gpus_per_node": 8, "tp": 1, "pp": 1, "gpu_type": fam.gpu_type}
    return {**{name: {"gpu_type": fam.gpu_type, **row} for name, row in fam.presets.items()}, CUSTOM_LAYOUT: custom}


# --- what a family's descriptor tells copier ----------------------------------------------------------


def _family(model: str):
    """The descriptor model names, None for a family this template does not have (the model
    answer's own check names it)."""
    module = package()["family"]
    try:
        return module.family(str(model))
    except package()["config"].ConfigError:
        return None


@functools.cache
def facts(model: str) -> dict:
    """What copier.yml and the templates ask of a family instead of testing its name (asked dozens of
    times a render: read once per family; the templates only read it)."""
    fam = _family(model) or package()["family"].Family(name=str(model), summary="", builder="")
    readme = PACKAGE_DIR / "models" / fam.name / "README.md.jinja"
    return {
        "name": fam.name,
        "families": " | ".join(package()["family"].families(strict=True)),  # a broken family folder: its one line
        "title": fam.title or fam.name,
        "summary": fam.summary,
        "default_size": fam.default_size or next(iter(fam.sizes), ""),
        "default_strategy": fam.default_strategy,
        "gpu_type": fam.gpu_type,
        "recipes": list(fam.recipes),
        "layouts": fam.layouts,
        "presets": bool(fam.presets),
        "pretrained": fam.pretrained,
        "causal": fam.causal,
        "tokenizer": fam.tokenizer,
        "exports_own_code": fam.exports_own_code,
        "vocab_size": fam.vocab_size,
        "vocab_note": fam.vocab_note,
        # the family's own README section, included by the project's README (a path in the template repository)
        "readme": readme.relative_to(ROOT).as_posix() if readme.is_file() else "",
    }


# A question's default from the family: from the chosen preset where the family has presets, else
# the descriptor's own, else the value of a family without either.
PRESET_KEYS = {"model_size": "size", "nodes": "nodes", "gpus_per_node": "gpus_per_node", "tensor_parallel": "tp",
               "pipeline_parallel": "pp", "gpu_type": "gpu_type"}  # fmt: skip
PLAIN_DEFAULTS = {"nodes": 1, "gpus_per_node": 8, "tensor_parallel": 1, "pipeline_parallel": 1}


def family_default(question: str, model: str, layout: str = ""):
    """The default of `question` for a project of `model` (on the preset `layout`, where it has presets)."""
    known = facts(model)
    if question == "gpt3_layout":
        return next(iter(layouts(model)), "")
    if question == "strategy":
        return known["default_strategy"]
    row = layouts(model).get(str(layout)) if known["presets"] else None
    if row and question in PRESET_KEYS:
        return row[PRESET_KEYS[question]]
    if question == "model_size":
        return known["default_size"]
    if question == "gpu_type":
        return known["gpu_type"]
    return PLAIN_DEFAULTS[question]


def family_choices() -> dict[str, str]:
    """The model question's menu, summary -> name, from every family's descriptor."""
    return {fam.summary: name for name, fam in package()["family"].families(strict=True).items()}


PLATFORMS_DIR = PACKAGE_DIR / "launch"


def platform_names() -> list[str]:
    """The template's platforms: the folders of the package's launch/ (each a platform's whole code)."""
    return sorted(p.parent.name for p in PLATFORMS_DIR.glob("*/__init__.py"))


def platform_choices() -> dict[str, str]:
    """The platforms question's menu, label -> name: the title of each platform's README part
    (launch/<platform>/README.md.jinja, whose first line is its `### ` heading)."""
    return {platform_title(name): name for name in platform_names()}


def platform_title(name: str) -> str:
    readme = PLATFORMS_DIR / name / "README.md.jinja"
    first = readme.read_text().lstrip().splitlines()[0] if readme.is_file() else ""
    return first.lstrip("#").strip() or name


def platform_files(name: str) -> str:
    """What the folder of a platform holds, from its __init__.py's docstring (the README's file list)."""
    doc = ast.get_docstring(ast.parse((PLATFORMS_DIR / name / "__init__.py").read_text())) or name
    return " ".join(doc.split())


# train.yaml's values copier writes quoted, as answers are (a size such as 1.3B stays a string to any reader).
QUOTED_SETTINGS = {"size", "pretrained"}


def _yaml_value(key: str, value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        plain = value and key not in QUOTED_SETTINGS and yaml.safe_load(f"v: {value}") == {"v": value}
        return value if plain else json.dumps(value)
    return repr(value)


def config_lines(model: str, section: str, answers: dict) -> str:
    """The family's lines of train.yaml's `section`, indented under it, each with its comment."""
    fam = _family(model) or package()["family"].Family(name=str(model), summary="", builder="")
    lines = []
    for key, value, comment in fam.config_settings(section, answers):
        if key is None:
            lines.append(f"  # {comment}")
            continue
        line = f"  {key}: {_yaml_value(key, value)}"
        lines.append(f"{line.ljust(24)} # {comment}" if comment else line)
    return "\n".join(lines)


def layout_label(name: str, row: dict) -> str:
    """'1.3B, 2 x 8 GPUs: 4 data x 4 pipeline': what the menu shows for a preset."""
    if name == CUSTOM_LAYOUT:
        return "Custom: choose size, nodes and degrees yourself"
    nodes, gpus, tp, pp = row["nodes"], row["gpus_per_node"], row["tp"], row["pp"]
    world = nodes * gpus
    if world == 1:
        return f"{row['size']}, 1 GPU"
    if nodes == 1 and tp * pp == 1:
        return f"{row['size']}, {world} GPUs data parallel"
    degrees = [f"{world // (tp * pp)} data"] + [f"{pp} pipeline"] * (pp > 1) + [f"{tp} tensor"] * (tp > 1)
    return f"{row['size']}, {nodes} x {gpus} GPUs: {' x '.join(degrees)}"


def size_names(model: str) -> str:
    """The sizes of a family, from its descriptor ("" for a family this template does not have)."""
    try:
        return package()["family"].family(model).size_names()
    except package()["config"].ConfigError:
        return ""


def recipe(model: str, size: str) -> dict:
    """The family's starting recipe for a size (global_batch, micro_batch, lr, sequence_len); the generic
    one for a family this template does not have (the model answer's own check names it)."""
    family = package()["family"]
    try:
        return family.family(model).recipe(str(size))
    except package()["config"].ConfigError:
        return family.Family(name=str(model), summary="", builder="").recipe(str(size))


def micro_batch_at(global_batch: int, data_parallel_size: int, largest: int) -> int:
    """The micro batch train.yaml renders for this global batch and data-parallel size (rules.py's rule,
    which plan's scaling table applies too), at most `largest`: the family's."""
    return package()["batch"].micro_batch_at(int(global_batch), int(data_parallel_size), int(largest))


def layout_choices(model: str) -> dict[str, str]:
    return {layout_label(name, row): name for name, row in layouts(model).items()}


# --- copier.yml: questions, their order, their defaults ---------------------------------------------


@functools.cache
def copier_spec() -> dict:
    # libyaml's loader when PyYAML has it: ten times faster on this 700-line file, the same result.
    return yaml.load(COPIER_YML.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def questions() -> dict[str, dict]:
    """copier.yml's questions in the order copier asks them (keys starting with '_' are settings)."""
    return {name: q for name, q in copier_spec().items() if not name.startswith("_")}


def question_order() -> list[str]:
    return list(questions())


@functools.cache
def _jinja() -> jinja2.Environment:
    """copier's environment for this template: sandboxed, with copier's filters and the template's
    `_jinja_extensions` (path entries are relative to the template root)."""
    from jinja2.sandbox import SandboxedEnvironment

    extensions = COPIER_EXTENSIONS + list(copier_spec().get("_jinja_extensions", []))
    return SandboxedEnvironment(
        loader=jinja2.FileSystemLoader(str(ROOT)), extensions=extensions, keep_trailing_newline=True
    )


@functools.cache
def _default_template(source: str) -> jinja2.Template:
    return _jinja().from_string(source)


def _typed(question: dict, value):
    """An answer as copier types it: numbers from text, a multiselect from "[a, b]" or "a,b"."""
    if question.get("multiselect"):
        if isinstance(value, str):
            value = [item.strip(" '\"") for item in value.strip().strip("[]").split(",") if item.strip(" '\"")]
        order = [str(choice) for choice in _choices(question)]  # copier records them in the menu's order
        return sorted(value, key=lambda item: order.index(str(item)) if str(item) in order else len(order))
    kind = question.get("type", "yaml")
    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool" and isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y")
    if kind in ("yaml", "json") and isinstance(value, str):
        return yaml.safe_load(value)
    if kind == "str":
        return str(value)
    return value


def complete(answers: dict) -> dict:
    """Every question's answer: the given ones typed as copier types them, copier.yml's default for
    the others, rendered in question order against the answers before it (copier --defaults)."""
    given = {name: value for name, value in answers.items() if value is not None}
    a: dict = {}
    for name, question in questions().items():
        if name in given:
            a[name] = _typed(question, given[name])
            continue
        if "default" not in question:
            continue
        default = question["default"]
        if isinstance(default, str):
            if question.get("when") is False and name not in _template_tables():
                continue  # a check run for its refusal, or a value rendered from answers for the files
            default = _default_template(default).render(a)
        a[name] = _typed(question, default)
    return {**{name: value for name, value in given.items() if name not in a}, **a}


@functools.cache
def _template_tables() -> set[str]:
    """Hidden yaml questions that depend on no answer (a family's layouts): the defaults read them."""
    names = set(questions())
    return {
        name
        for name, question in questions().items()
        if question.get("when") is False
        and question.get("type") in ("yaml", "json")
        and isinstance(question.get("default"), str)
        and not jinja2.meta.find_undeclared_variables(_jinja().parse(question["default"])) & names
    }


def render_train_yaml(answers: dict) -> str:
    """config/train.yaml as the template renders it for these (complete) answers."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.globals["family_recipe"] = recipe
    env.globals["micro_batch_at"] = micro_batch_at
    env.globals["family_facts"] = facts
    env.globals["family_settings"] = lambda section: config_lines(answers["model"], section, answers)
    source = (TEMPLATE / "config" / "train.yaml.jinja").read_text()
    answers = dict(answers)
    for name in sorted(jinja2.meta.find_undeclared_variables(env.parse(source)) & computed_names() - set(answers)):
        answers[name] = _typed(questions()[name], _default_template(questions()[name]["default"]).render(answers))
    return env.from_string(source).render(answers)


# --- which answer a problem is blamed on ---------------------------------------------------------


def blamed_answer(fix_key: str | None, keys: tuple[str, ...] = ()) -> str:
    """The answer to change for a problem: the one its fix key is rendered from; else the last asked
    of the answers its keys come from (the first question at which all of them are known); else the
    last answer train.yaml depends on, where every input of a rule is known."""
    if fix_key in CONFIG_ANSWERS:
        return CONFIG_ANSWERS[fix_key]
    named = [CONFIG_ANSWERS[key] for key in keys if key in CONFIG_ANSWERS] or list(CONFIG_ANSWERS.values())
    return max(named, key=question_order().index)


def _line(a: dict, field: str, message: str) -> str:
    value = a.get(field)
    value = package()["bounds"].shown(str(",".join(value) if isinstance(value, list) else value), quoted=False)
    return f"{field}={value}: {' '.join(message.split())}"


# config_problems' findings by answers: one copy asks it of the same answers several times (a validator,
# the given answers, the last check), and each asking renders and loads a train.yaml.
_CONFIG_PROBLEMS: dict[tuple[str, bool], list] = {}


def config_problems(a: dict, fit: bool = True) -> list[tuple[str, str]]:
    """(answer blamed, message) for every rule the generated config breaks, then plan's memory fit."""
    key = (json.dumps(a, sort_keys=True, default=repr), fit)
    if key not in _CONFIG_PROBLEMS:
        _CONFIG_PROBLEMS[key] = _config_problems(a, fit)
    return list(_CONFIG_PROBLEMS[key])


def _config_problems(a: dict, fit: bool) -> list[tuple[str, str]]:
    pkg = package()
    config_error = pkg["config"].ConfigError
    try:  # the family's sizes first: train.yaml's recipe looks the size up in the family's table
        pkg["family"].model_shape(str(a["model_size"]), None, a["model"])
    except config_error as exc:
        return [(blamed_answer(exc.key or "model.size", ("model.arch", "model.size")), str(exc))]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.yaml"
        path.write_text(render_train_yaml(a))
        try:
            cfg = pkg["config"].load_config(path)
        except config_error as exc:
            return [(blamed_answer(exc.key, (exc.key,) if exc.key else ()), str(exc))]
    found = [_weakly_scaled(a, blamed_answer(p.fix_key, p.keys), p) for p in pkg["rules"].check_config(cfg)]
    if not found and fit:
        try:
            problem = pkg["fit"].fit_problem(cfg)
        except config_error as exc:  # no figures for this GPU type (gpus.py)
            problem = pkg["rules"].Problem(str(exc), exc.key or "cluster.gpu_type")
        if problem:
            found.append((blamed_answer(problem.fix_key, problem.keys), problem))
    return found


def _weakly_scaled(a: dict, blamed: str, message) -> tuple[str, str]:
    """Under weak scaling the global batch is batch_per_gpu x the data-parallel GPUs: a problem of it is
    the batch_per_gpu answer's (global_batch_size is not asked then)."""
    if blamed != "global_batch_size" or a.get("scaling") != "weak":
        return blamed, message
    return "batch_per_gpu", f"{message} (weak scaling: the global batch is batch_per_gpu x the data-parallel GPUs)"


def platform_problems(a: dict) -> list[tuple[str, str]]:
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
            found.append(
                (
                    "nodes",
                    (
                        f"the Kubernetes job name '{a['project_slug']}' gives pod names such as "
                        f"'{a['project_slug']}{longest}' of {len(a['project_slug']) + len(longest)} characters, over the "
                        f"{DNS_LABEL} of a DNS-1123 label; use a slug of at most {DNS_LABEL - len(longest)} characters"
                    ),
                )
            )
        if not str(a.get("pvc_name") or "").strip():
            found.append(
                (
                    "pvc_name",
                    "Kubeflow pods mount the shared storage from a PersistentVolumeClaim; "
                    "give the name of an existing PVC, e.g. shared-data",
                )
            )
    return found


# The longest text an answer may be: paths as the system allows them; a network interface as Linux
# names one (IFNAMSIZ less its NUL); everything else names a thing on a platform (an image, a PVC, a
# label, a partition, an id), which none allows beyond a DNS subdomain's 253 characters.
PATH_ANSWERS = ("shared_mount", "data_dir", "output_dir", "pretrained_dir")
LONGEST_TEXT = 253
LONGEST_PATH = 4096
LONGEST_INTERFACE = 15


def text_problems(a: dict) -> list[tuple[str, str]]:
    """Text answers longer than anything they could name (a 400-character partition or image)."""
    found = []
    for name, question in questions().items():
        value = a.get(name)
        if question.get("type") != "str" or not isinstance(value, str) or name in computed_names():
            continue
        if name == "nccl_socket_ifname":
            items = value.lstrip("^=").split(",")
            longest = max(items, key=len)
            if len(longest) > LONGEST_INTERFACE:
                found.append(
                    (name, f"interface '{longest[:20]}' is longer than Linux's {LONGEST_INTERFACE} characters")
                )
            continue
        most = LONGEST_PATH if name in PATH_ANSWERS else LONGEST_TEXT
        if len(value) > most:
            found.append((name, f"no {name} is {len(value)} characters long (at most {most}); shorten it"))
    return found


def notes(answers: dict) -> list[str]:
    """Things worth knowing that are not errors."""
    a = complete(answers)
    out = []
    if "tione" in a["platforms"] and a["fabric"] != "tcp":
        out.append(
            "TI-ONE HCC machines inject their own NCCL_IB_* settings; config/nccl.env only sets what "
            "the platform leaves unset (node applies it with setdefault)"
        )
    return out


def field_problems(answers: dict, fit: bool = True) -> list[tuple[str, str]]:
    """(answer blamed, message), platform rules first, then the config rules."""
    a = complete(answers)
    return text_problems(a) + platform_problems(a) + config_problems(a, fit)


def line(answers: dict, field: str, message: str) -> str:
    """One problem as "<answer>=<value>: <why>; <what to do>"."""
    return _line(complete(answers), field, message)


def problems(answers: dict) -> list[str]:
    """Every cross-field problem of a full set of answers, one line each; empty when they are fine."""
    return [line(answers, field, message) for field, message in field_problems(answers)]


# --- answers as given (--data, --data-file, cookiecutter's key=value), before copier types them --------

WHOLE_NUMBER = re.compile(r"\s*[+-]?[0-9]+\s*")
FALSE_WORDS = ("", "0", "false", "no", "off", "n", "f", "none", "null")


def computed_names() -> set[str]:
    """Hidden questions (`when: false`): copier derives them, and a given answer would replace the derivation."""
    return {name for name, question in questions().items() if question.get("when") is False}


def unknown_name_problem(name: str) -> str:
    """Why `name` is not an answer this template takes ("" when it is one), with the closest question."""
    if name in computed_names():
        return f"answer '{name}' is computed from the other answers, not asked; leave it out"
    if name in questions():
        return ""
    asked = [q for q in questions() if q not in computed_names()]
    close = difflib.get_close_matches(name.lower().replace("-", "_"), asked, n=1)
    if close:
        return f"unknown answer '{name}': did you mean '{close[0]}'?"
    return f"unknown answer '{name}': no question has that name (README.md lists them)"


def question_choices(name: str, answers: dict | None = None) -> list:
    """The choices of a question of copier.yml (rendered ones for the answers given)."""
    return _choices(questions()[name], answers)


def _choices(question: dict, answers: dict | None = None) -> list:
    """A question's choices; rendered ones (a family's layouts, the families) for the answers given."""
    choices = question.get("choices") or []
    if isinstance(choices, str):  # rendered by copier into YAML
        choices = yaml.safe_load(_default_template(choices).render(answers or {}))
    return list(choices.values()) if isinstance(choices, dict) else list(choices)


def _whole(value) -> int | None:
    """An integer answer as text or YAML; None where copier's int() would fail, truncate (1.5) or count (true)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and WHOLE_NUMBER.fullmatch(value):
        return int(value)
    return None


def _list_problem(name: str, value, allowed: list) -> str:
    example = f"{name}=[{', '.join(map(str, allowed[:2]))}]"
    try:
        items = yaml.safe_load(value) if isinstance(value, str) else value
    except yaml.YAMLError:
        items = None
    if not isinstance(items, list):
        return f"{name} '{value}' is not a list; give one such as {example}"
    wrong = [item for item in items if item not in allowed]
    if wrong:
        return f"{name} item '{wrong[0]}' is not one of {', '.join(map(str, allowed))}; e.g. {example}"
    return ""


def given_problems(data: dict) -> list[tuple[str, str]]:
    """(answer, message) for answers copier would drop or stop on with a traceback: an unknown or
    computed name, a number that is not whole, a value outside the question's choices, a list that
    is not one (copier would drop unknown list items silently). Keys starting with '_' are copier's."""
    found = []
    for name, value in data.items():
        if str(name).startswith("_"):
            continue
        unknown = unknown_name_problem(str(name))
        if unknown:
            found.append((name, unknown))
            continue
        # a family's layouts are the choices of gpt3_layout: the model given, else the default one
        context = {"model": data.get("model", questions()["model"].get("default"))}
        question, allowed = questions()[name], _choices(questions()[name], context)
        if value is None and question.get("type", "yaml") not in ("yaml", "json"):  # `name:` in a --data-file
            found.append((name, f"{name} has no value; give one or leave {name} out for its default"))
            continue
        if question.get("multiselect"):
            problem = _list_problem(name, value, allowed)
            if problem:
                found.append((name, problem))
            continue
        if question.get("type") == "int":
            number = _whole(value)
            if number is None:
                example = complete({}).get(name, 1)
                found.append((name, f"{name} '{value}' is not a whole number; give one such as {name}={example}"))
                continue
            value = number
        if allowed and value not in allowed and str(value) not in map(str, allowed):
            found.append((name, f"{name} '{value}' is not one of {', '.join(map(str, allowed))}"))
    return found


def _truthy(rendered) -> bool:
    return rendered if isinstance(rendered, bool) else str(rendered).strip().lower() not in FALSE_WORDS


def question_problems(answers: dict, given=()) -> list[tuple[str, str]]:
    """(question, message) for each question whose copier.yml validator refuses its answer, in
    question order, as copier applies them: a given answer even when its question is not asked, a
    default only when it is. Cross-field rules stay silent here (answer_problems, as under
    --defaults): field_problems reports them."""
    a = complete(answers)
    context = {**a, "_copier_conf": {"defaults": True}}
    found = []
    for name, question in questions().items():
        if "validator" not in question or name not in a:
            continue
        when = question.get("when", True)
        if name in given or _truthy(_default_template(when).render(context) if isinstance(when, str) else when):
            message = " ".join(_default_template(question["validator"]).render(context).split())
            if message:
                found.append((name, message))
    return found


def settled_question_problems(given: dict) -> list[tuple[str, str]]:
    """question_problems for an interactive run, before any question is asked: only the given
    answers whose validator reads nothing but given answers, so the verdict is the one copier would
    reach at that question, without copier's traceback there. Validators that read answers still to
    be asked, or the cross-field rules, judge when their question comes."""
    names = set(question_order())
    settled = {
        name
        for name in given
        if "validator" in questions().get(name, {})
        and "answer_problems" not in questions()[name]["validator"]
        and _read_answers(questions()[name]["validator"]) & names <= set(given)
    }
    return [(name, message) for name, message in question_problems(given, given) if name in settled]


def _read_answers(source: str) -> set[str]:
    return jinja2.meta.find_undeclared_variables(_jinja().parse(source))


# --- project_slug: names the package must not take --------------------------------------------------

SLUG = re.compile(r"[a-z][a-z0-9]{0,39}")


# The first name of an import statement at the start of a line (absolute imports only). A line scan, not
# ast.parse: this runs on every copy, and parsing every module cost ~1 s of each `copier copy`.
IMPORT_LINE = re.compile(
    r"^[ \t]*(?:import[ \t]+([A-Za-z_][\w., \t]*)|from[ \t]+([A-Za-z_]\w*)[\w.]*[ \t]+import\b)", re.M
)


def _imported_modules() -> set[str]:
    """Top-level modules the generated package and its tests import (absolute imports only)."""
    names = set()
    for path in [*(TEMPLATE / "src").rglob("*"), *(TEMPLATE / "tests").rglob("*")]:
        if ".py" not in path.name or path.suffix == ".pyc" or not path.is_file():
            continue
        for imported, source in IMPORT_LINE.findall(path.read_text(encoding="utf-8", errors="replace")):
            if source:
                names.add(source)
            for alias in imported.split(","):  # import a.b as c, d
                if alias.split():
                    names.add(alias.split()[0].split(".")[0])
    return names


def _requirements() -> set[str]:
    """Distribution names in template/pyproject.toml.jinja (dependencies, extras, build), for every model
    with every platform and DeepSpeed."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the imported modules above still cover what the code uses
        return set()
    text = (TEMPLATE / "pyproject.toml.jinja").read_text()
    names = set()
    every_part = {"platforms": _choices(questions()["platforms"]), "strategy": "deepspeed", "with_deepspeed": True}
    for model in _choices(questions()["model"]):
        spec = tomllib.loads(jinja2.Environment().from_string(text).render(model=model, project_slug="x", **every_part))
        project = spec.get("project", {})
        requirements = [*project.get("dependencies", []), *spec.get("build-system", {}).get("requires", [])]
        requirements += [r for extra in project.get("optional-dependencies", {}).values() for r in extra]
        names.update(re.match(r"[A-Za-z0-9._-]+", r)[0].lower().replace("-", "_") for r in requirements)
    return names


@functools.cache
def reserved_slugs() -> dict[str, str]:
    """Names project_slug must not take, each with why. The slug names the package on sys.path (src/ is
    first when the project runs `python -m <slug>`) and the distribution `pip install -e .` installs."""
    reserved = {
        name: f"is the name of the dependency {name}: `pip install -e .` would replace it" for name in _requirements()
    }
    shadows = "the package would shadow it and the project could not start"
    reserved.update(
        {name: f"is Python's standard-library module {name}: {shadows}" for name in sys.stdlib_module_names}
    )
    reserved.update(
        {name: f"is the name of the module {name} the project imports: {shadows}" for name in _imported_modules()}
    )
    reserved.update({name: "is a Python soft keyword (match, case and type statements)" for name in keyword.softkwlist})
    reserved.update({name: f"is a Python keyword: `import {name}` is a syntax error" for name in keyword.kwlist})
    return {name: why for name, why in reserved.items() if SLUG.fullmatch(name)}


def slug_problem(slug: str) -> str:
    """Why project_slug cannot be `slug` (a module the project would shadow, a keyword), "" when it can."""
    why = reserved_slugs().get(slug)
    if not why:
        return ""
    suggestion = next(s for s in (slug[:35] + tail for tail in ("train", "run", "proj")) if s not in reserved_slugs())
    return f"project_slug '{slug}' {why}; choose another, e.g. '{suggestion}'."


def main(argv: list[str]) -> int:
    import json

    found = problems(json.loads(argv[0]) if argv else {})
    for text in found:
        print(text, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

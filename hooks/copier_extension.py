"""Jinja extension that lets copier's validators run the cross-field rules before anything is written.

Loaded by copier.yml through copier-template-extensions (pip install copier copier-template-extensions):

    _jinja_extensions:
      - copier_template_extensions.TemplateExtensionLoader
      - hooks/copier_extension.py:RulesExtension

Globals it adds:
    answer_problems('tensor_parallel', ...)  in a `validator`: the first problem to be fixed in one of
                                             these answers, "" when they are fine (copier shows it and
                                             asks again); upto='gpu_type': in any answer asked so far.
                                             With --defaults it stays silent: copier would print a
                                             traceback, and refuse_bad_answers reports the same line
    refuse_bad_answers()                     in the default of a hidden question asked last: stops copier
                                             (exit 1) with the one line "Validation error for question
                                             '<field>': <field>=<value>: <why>; <fix>" for the first
                                             problem left: hidden questions have no validators, and
                                             older copier versions did not validate defaults
    path_characters_problem('data_dir', data_dir)
                                             "" or why the path holds a character that shell, sbatch or
                                             env files read specially: the one rule for every path answer
    image_reference_problem('image', image, 'registry.example.com/run:v1')
                                             "" or why the answer is not an image reference, with the
                                             example as the fix: the one rule for every image answer
    refuse_bad_given_answers()               in the default of a hidden question asked first: stops copier
                                             (exit 1, one line, no traceback) on an answer given with
                                             --data/--data-file that copier would drop or crash on (an
                                             unknown name, "two" for a number, a value outside the
                                             choices) and, with --defaults, on the first answer any
                                             validator or cross-field rule refuses
    slug_problem(project_slug)               "" or why the slug would shadow a module the project
                                             imports (standard library, dependencies) or is a keyword
    path_placement_problem('data_dir', data_dir, example, shared_mount, platforms)
                                             "" or why the path is the root folder, or lies outside the
                                             shared mount (Kubeflow), both judged on the normalised path
    paths_apart_problem(data_dir, output_dir)
                                             "" or why output_dir is, lies inside or holds data_dir
    node_labels_problem('k8s_node_labels', text), node_label_terms(text)
                                             "" or why the text is not key=value|value,key labels; and
                                             the node-affinity expressions it stands for
    tolerations_problem('k8s_tolerations', text), toleration_items(text)
                                             "" or why the text is not key[=value][:effect] taints; and
                                             the pod tolerations it stands for
    family_recipe(model, model_size)         the family's starting recipe (global and micro batch, lr,
                                             sequence length), what train.yaml and the batch defaults read
    micro_batch_at(global, dp, micro)        the micro batch train.yaml renders: the largest up to the
                                             family's that splits the global batch over dp ranks (the
                                             rule plan's scaling table applies for more nodes)
    family_sizes(model)                      the sizes model_size takes, from the family's descriptor
    family_layout_choices(model)             the family's named layouts (presets of its descriptor and
                                             'custom') as a menu: label -> name (JSON)
    family_choices()                         the model question's menu: every family's summary -> name
    platform_choices()                       the platforms question's menu: each folder of the package's
                                             launch/, labelled by its README part's heading
    platform_files(name)                     the README file list's lines for a platform's folder
    family_facts(model)                      what the templates ask of a family instead of testing its
                                             name: title, default_size, default_strategy, recipes, layouts,
                                             presets, pretrained, causal, tokenizer, exports_own_code,
                                             vocab_size, vocab_note, readme (its README section's path)
    family_default('nodes', model, layout)   a question's default for the family (and its preset)
    family_settings('model')                 the family's lines of train.yaml's section (model, optim,
                                             schedule) for the answers so far, from its descriptor
    quantity_problem('k8s_cpu_limit', value, 'cpu', request)
                                             "" or why the value is not a Kubernetes quantity (or is a
                                             limit below its request)

Filter it adds:
    {{ slurm_partition | shown }}            an answer quoted in a message: a newline escaped (the
                                             message stays one line), a long answer cut to its length

The cross-field rules come from hooks/answers.py, which runs the generated package's rules.py/plan.py.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import posixpath
import re
import sys
import textwrap
from pathlib import Path

from jinja2 import pass_context
from jinja2.ext import Extension

_PATH = Path(__file__).resolve().parent / "answers.py"
# One module per template checkout: `copier update` renders the old and the new version in one process.
_ANSWERS = "dtt_hooks_answers_" + hashlib.sha256(str(_PATH).encode()).hexdigest()[:12]

# Quotes, backslash, $, `, %, # and control characters: launch scripts, sbatch and env files would
# expand, cut or reinterpret a path holding one.
SHELL_SPECIAL = re.compile(r"[\"'`$%#\\\x00-\x1f\x7f]")
# registry[:port]/path[:tag][@sha256:digest] with lowercase name components: docker's reference grammar, simplified.
IMAGE_REFERENCE = re.compile(
    r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?"
)


def _answers_module():
    if _ANSWERS not in sys.modules:
        spec = importlib.util.spec_from_file_location(_ANSWERS, _PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[_ANSWERS] = module
        spec.loader.exec_module(module)
    return sys.modules[_ANSWERS]


def _given(context) -> dict:
    """The answers known so far (earlier questions, --data, last answers on update)."""
    names = _answers_module().question_order()
    return {name: context[name] for name in names if name in context and context[name] is not None}


def _refusal():
    """copier's CLI prints a UserMessageError and exits 1 without a traceback; being a ValueError too,
    it is caught where copier's validation errors are (API callers such as cookiecutter's pre_gen hook)."""
    from copier.errors import UserMessageError

    class AnswersRefused(UserMessageError, ValueError):
        pass

    return AnswersRefused


def _non_interactive(context) -> bool:
    conf = context.get("_copier_conf")
    try:
        return bool(conf and conf["defaults"])
    except (KeyError, TypeError):
        return False


@pass_context
def answer_problems(context, *fields: str, upto: str | None = None) -> str:
    """First problem to be fixed in one of `fields` (or in any question up to `upto`), "" when fine.

    Each problem blames one answer (hooks/answers.py: the answer of the config key whose change fixes
    it, else the last question its keys involve) and is reported by that question's validator, with
    the answers known so far and copier's defaults for the rest; the memory fit only once gpu_type
    is known.
    """
    if _non_interactive(context):
        return ""  # answers_check reports it last, as one message without copier's traceback
    rules = _answers_module()
    if upto:
        order = rules.question_order()
        fields = tuple(order[: order.index(upto) + 1])
    answers = _given(context)
    for blamed, message in rules.field_problems(answers, fit="gpu_type" in answers):
        if blamed in fields:
            return rules.line(answers, blamed, message)
    return ""


def shown(value) -> str:
    """An answer quoted inside a one-line message (the package's bounds.shown: a newline escaped, a
    long answer cut to its first characters and its length)."""
    return _answers_module().package()["bounds"].shown(str(value))


def _refuse(field: str, message: str):
    """Stop copier with one line naming the answer; an answer that is no question is named as given."""
    rules = _answers_module()
    if field in rules.questions() and field not in rules.computed_names():
        raise _refusal()(f"Validation error for question '{field}': {message}")
    raise _refusal()(message)


@pass_context
def refuse_bad_answers(context) -> str:
    """Raise, naming the answer to change, when the full set of answers breaks a rule."""
    answers = _given(context)
    rules = _answers_module()
    for field, message in rules.field_problems(answers):
        _refuse(field, rules.line(answers, field, message))
    return "ok"


@pass_context
def refuse_bad_given_answers(context) -> str:
    """Raise on the first answer given (--data, --data-file, cookiecutter's hook) that copier would drop
    silently or stop on with a traceback, before copier types a single one; with --defaults also on the
    first answer, given or default, that a validator or a cross-field rule refuses. Interactive runs
    check the rest while asking (the validators), and refuse_bad_answers at the end."""
    rules = _answers_module()
    try:
        given = dict(context["_copier_conf"]["data"])
    except (KeyError, TypeError):
        given = {}
    for field, message in rules.given_problems(given):
        _refuse(field, message)
    if _non_interactive(context):
        answers = _given(context)  # the given ones and, on `copier update`, the recorded ones
        for field, message in rules.question_problems(answers, given):
            _refuse(field, message)
        for field, message in rules.field_problems(answers):
            _refuse(field, rules.line(answers, field, message))
    else:
        for field, message in rules.settled_question_problems(given):
            _refuse(field, message)
    return "ok"


def path_characters_problem(field: str, value: str) -> str:
    """Why the path answer `field` cannot be used, "" when its characters are fine."""
    if not SHELL_SPECIAL.search(str(value)):
        return ""
    return (
        f"{field} {shown(value)} holds a character that shell, sbatch or env files would read specially (quotes, "
        "backslash, $, `, %, # or a control character); choose a path without them."
    )


def slug_problem(slug: str) -> str:
    """Why project_slug cannot be `slug`, "" when it can (hooks/answers.py derives the names)."""
    return _answers_module().slug_problem(str(slug))


def _normalised(path: str) -> str:
    """posixpath.normpath, with POSIX's leading '//' (which Linux reads as '/') made one slash."""
    normal = posixpath.normpath(str(path))
    return "/" + normal.lstrip("/") if normal.startswith("//") else normal


def path_placement_problem(field: str, value: str, example: str, mount: str = "", platforms=()) -> str:
    """Why the absolute path answer `field` cannot be used where it points, "" when it can. Judged on
    the normalised path, so `/srv/../etc` is /etc: the root folder (data and checkpoints would
    be written among the system's folders), or, for Kubeflow, a path outside the shared mount (the
    pods see only the volume mounted there)."""
    path = _normalised(value)
    meant = f" (that is {path})" if path != str(value) else ""
    if path == "/":
        return f"{field} {shown(value)} is the root folder{meant}; give a folder of its own, e.g. {example}."
    if mount and "kubeflow" in platforms and not path.startswith(_normalised(mount).rstrip("/") + "/"):
        return (
            f"{field} {shown(value)}{meant} must lie under shared_mount {mount}, where the pods mount the shared "
            f"volume; e.g. {example}."
        )
    return ""


def paths_apart_problem(data_dir: str, output_dir: str) -> str:
    """Why output_dir cannot be where it is relative to data_dir, "" when the two are apart: cleaning
    one (a new dataset, old runs) must never delete the other, and data globs must not meet checkpoints."""
    data, output = _normalised(data_dir), _normalised(output_dir)
    if output == data:
        where = "is data_dir itself"
    elif output.startswith(data.rstrip("/") + "/"):
        where = f"lies inside data_dir '{data_dir}'"
    elif data.startswith(output.rstrip("/") + "/"):
        where = f"holds data_dir '{data_dir}'"
    else:
        return ""
    parent = posixpath.dirname(data)
    apart = next(
        candidate
        for candidate in (posixpath.join(parent, name) for name in ("runs", "outputs", "checkpoints"))
        if candidate != data and not candidate.startswith(data + "/")
    )
    return (
        f"output_dir '{output_dir}' {where}: keep them apart so that cleaning one never deletes the other "
        f"and token shards never mix with checkpoints; e.g. output_dir={apart}."
    )


def image_reference_problem(field: str, value: str, example: str) -> str:
    """Why the answer `field` is not an image reference, "" when it is one."""
    if IMAGE_REFERENCE.fullmatch(str(value)):
        return ""
    return f"{field} {shown(value)} is not a valid image reference; use registry/name:tag, e.g. {example}."


# Kubernetes label keys and values (apimachinery's validation): an optional DNS-subdomain prefix
# and a name of at most 63 characters; values of at most 63, possibly empty.
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# A resource quantity without sign: digits with a binary (Ki..Ei) or decimal (m, k..E) suffix, or an exponent.
QUANTITY = re.compile(r"(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>[KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]+)?")
QUANTITY_FACTORS = {
    "": 1,
    "m": 1e-3,
    **{s: 1000.0**i for i, s in enumerate("kMGTPE", 1)},
    **{s + "i": 1024.0**i for i, s in enumerate("KMGTPE", 1)},
}


def _items(text: str) -> list[str]:
    return [item.strip() for item in str(text).split(",") if item.strip()]


def _label_key_problem(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash and not (LABEL_PREFIX.fullmatch(prefix) and len(prefix) <= 253):
        return f"its prefix '{prefix}' is not a DNS subdomain"
    if not LABEL_NAME.fullmatch(name):
        return f"'{name}' is not a label name (letters, digits, '-', '_', '.'; at most 63)"
    return ""


def node_label_terms(text: str) -> list[dict]:
    """k8s_node_labels as node-affinity match expressions: key=v1|v2 -> In [v1, v2], key -> Exists."""
    terms = []
    for item in _items(text):
        key, equals, values = item.partition("=")
        if equals:
            terms.append({"key": key.strip(), "operator": "In", "values": [v.strip() for v in values.split("|")]})
        else:
            terms.append({"key": key.strip(), "operator": "Exists"})
    return terms


def node_labels_problem(field: str, text: str) -> str:
    """Why k8s_node_labels cannot be used, "" when every item is a label key with legal values."""
    example = "e.g. nvidia.com/gpu.product=NVIDIA-A800-SXM4-80GB,nvidia.com/cuda.driver.major=535"
    for term in node_label_terms(text):
        why = _label_key_problem(term["key"])
        bad = [v for v in term.get("values", []) if not LABEL_NAME.fullmatch(v)]
        if why or bad:
            why = why or f"'{bad[0]}' is not a label value (letters, digits, '-', '_', '.'; at most 63)"
            return f"{field} {shown(text)}: label {term['key']}: {why}; write key=value, key=v1|v2 or key, {example}."
    return ""


def toleration_items(text: str) -> list[dict]:
    """k8s_tolerations as pod tolerations: key=value:Effect -> Equal, key[:Effect] -> Exists."""
    tolerations = []
    for item in _items(text):
        taint, _, effect = item.partition(":")
        key, equals, value = taint.partition("=")
        toleration = {"key": key.strip(), "operator": "Equal" if equals else "Exists"}
        if equals:
            toleration["value"] = value.strip()
        if effect.strip():
            toleration["effect"] = effect.strip()
        tolerations.append(toleration)
    return tolerations


def tolerations_problem(field: str, text: str) -> str:
    """Why k8s_tolerations cannot be used, "" when every item is key[=value][:effect]."""
    for toleration in toleration_items(text):
        key, effect = toleration["key"], toleration.get("effect")
        why = _label_key_problem(key) if key else "an empty key"
        if not why and toleration.get("value") and not LABEL_NAME.fullmatch(toleration["value"]):
            why = f"'{toleration['value']}' is not a taint value"
        if not why and effect and effect not in TAINT_EFFECTS:
            why = f"effect '{effect}' is not one of {', '.join(TAINT_EFFECTS)}"
        if why:
            return f"{field} {shown(text)}: {why}; write key[=value][:effect], e.g. nvidia.com/gpu:NoSchedule."
    return ""


def quantity_value(text: str) -> float | None:
    """The number a Kubernetes quantity stands for (cores, bytes), None when it is not one."""
    match = QUANTITY.fullmatch(str(text).strip())
    if not match:
        return None
    suffix = match["suffix"] or ""
    if suffix[:1] in "eE" and suffix:
        return float(match["number"] + suffix)
    return float(match["number"]) * QUANTITY_FACTORS[suffix]


# What one training pod can hold: no machine has more than 1,024 cores or 64 TiB of memory (the
# largest have a few hundred and 32 TiB), and no training process runs in under 1 GiB; a bare
# number of memory is bytes to Kubernetes, so "512" meant 512Gi.
POD_QUANTITY_RANGE = {"cpu": (0.0, 1024.0, "1024 cores"), "memory": (2.0**30, 2.0**46, "64Ti")}


def quantity_problem(field: str, value: str, resource: str, request: str = "") -> str:
    """Why a cpu or memory answer is not a positive quantity one pod can have, or is a limit below its
    `request`."""
    if not str(value).strip():
        return ""
    example = "64 or 500m" if resource == "cpu" else "512Gi or 64000Mi"
    amount = quantity_value(value)
    if amount is None or amount <= 0:
        return f"{field} {shown(value)} is not a {resource} quantity Kubernetes reads; use e.g. {example} (or empty)."
    least, most, most_text = POD_QUANTITY_RANGE[resource]
    if amount > most:
        return f"{field} {shown(value)} is more than one machine has (at most {most_text} a pod); use e.g. {example}."
    if amount < least:
        return (
            f"{field} {shown(value)} is {amount:.0f} bytes, less than a training process needs (1Gi); write the "
            f"unit, e.g. {str(value).strip()}Gi."
        )
    wanted = quantity_value(request) if str(request).strip() else None
    if wanted is not None and amount < wanted:
        return f"{field} {shown(value)} is below the request {request}: a limit must be at least the request; raise it."
    return ""


def family_facts(model: str) -> dict:
    """What copier.yml and the templates ask of a family (hooks/answers.py facts)."""
    return _answers_module().facts(str(model))


def family_choices() -> str:
    """The model question's menu, summary -> name, as JSON (copier reads string choices as YAML)."""
    return json.dumps(_answers_module().family_choices())


def platform_choices() -> str:
    """The platforms question's menu, title -> name, as JSON: a folder of the package's launch/ each."""
    return json.dumps(_answers_module().platform_choices())


def platform_files(name: str, width: int = 74) -> str:
    """The README file list's lines for a platform's folder (its __init__.py's docstring, wrapped)."""
    lines = textwrap.wrap(_answers_module().platform_files(str(name)), width, break_on_hyphens=False)
    return ("\n" + " " * 27).join(lines)


def family_default(question: str, model: str, layout: str = ""):
    """A question's default for a project of `model` on the preset `layout` (hooks/answers.py)."""
    return _answers_module().family_default(question, str(model), str(layout))


# The answers a family's train.yaml lines depend on (Family.config_settings).
SETTINGS_ANSWERS = ("model_size", "strategy", "gpt_recipe", "pretrained_dir")


@pass_context
def family_settings(context, section: str) -> str:
    """The family's lines of train.yaml's `section`, from its descriptor and the answers."""
    answers = {name: context[name] for name in SETTINGS_ANSWERS if name in context and context[name] is not None}
    return _answers_module().config_lines(str(context["model"]), section, answers)


def family_recipe(model: str, size: str) -> dict:
    """The family's starting recipe for a size: global_batch, micro_batch, lr, sequence_len (params)."""
    return _answers_module().recipe(str(model), str(size))


def micro_batch_at(global_batch: int, data_parallel_size: int, largest: int) -> int:
    """The micro batch for a global batch on data_parallel_size ranks, at most `largest` (rules.py)."""
    return _answers_module().micro_batch_at(global_batch, data_parallel_size, largest)


def family_sizes(model: str) -> str:
    """The family's sizes as its descriptor lists them (model_size's help)."""
    return _answers_module().size_names(str(model))


def family_layout_choices(model: str) -> str:
    """The layout menu, label -> name, as JSON (copier renders string choices, then reads them as YAML)."""
    return json.dumps(_answers_module().layout_choices(model))


def _compiled_once(from_string):
    """from_string that compiles each source once. copier compiles every validator, default and path
    again each time it evaluates one: ~1,400 compilations of ~300 distinct strings per copy, about
    half of a `copier copy`'s time. A template is a pure function of its source and the environment
    (whose globals it reads when rendered), so the first compilation serves every later call."""
    compiled = {}

    def cached(source, globals=None, template_class=None):
        if globals is not None or template_class is not None or not isinstance(source, str):
            return from_string(source, globals, template_class)
        if source not in compiled:
            compiled[source] = from_string(source)
        return compiled[source]

    return cached


def _refusing_config_errors(function):
    """`function`, with a ConfigError of the package (a family folder of the template that cannot be
    loaded, named by its file) stopping copier in that one line instead of a traceback through Jinja."""

    @functools.wraps(function)  # keeps jinja's pass_context mark
    def refusing(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except _answers_module().package()["config"].ConfigError as exc:
            raise _refusal()(str(exc)) from None

    return refusing


class RulesExtension(Extension):
    """Adds the rules' globals (listed in the module's docstring) to copier's Jinja environment."""

    def __init__(self, environment):
        super().__init__(environment)
        environment.from_string = _compiled_once(environment.from_string)
        environment.globals["answer_problems"] = answer_problems
        environment.filters["shown"] = shown
        environment.globals["refuse_bad_answers"] = refuse_bad_answers
        environment.globals["path_characters_problem"] = path_characters_problem
        environment.globals["image_reference_problem"] = image_reference_problem
        environment.globals["refuse_bad_given_answers"] = refuse_bad_given_answers
        environment.globals["slug_problem"] = slug_problem
        environment.globals["path_placement_problem"] = path_placement_problem
        environment.globals["paths_apart_problem"] = paths_apart_problem
        environment.globals["node_labels_problem"] = node_labels_problem
        environment.globals["node_label_terms"] = node_label_terms
        environment.globals["tolerations_problem"] = tolerations_problem
        environment.globals["toleration_items"] = toleration_items
        environment.globals["quantity_problem"] = quantity_problem
        environment.globals["family_facts"] = family_facts
        environment.globals["family_choices"] = family_choices
        environment.globals["platform_choices"] = platform_choices
        environment.globals["platform_files"] = platform_files
        environment.globals["family_default"] = family_default
        environment.globals["family_settings"] = family_settings
        environment.globals["family_sizes"] = family_sizes
        environment.globals["family_recipe"] = family_recipe
        environment.globals["micro_batch_at"] = micro_batch_at
        environment.globals["family_layout_choices"] = family_layout_choices
        for name, function in list(environment.globals.items()):
            if getattr(function, "__module__", None) == __name__:  # this module's, each of them
                environment.globals[name] = _refusing_config_errors(function)

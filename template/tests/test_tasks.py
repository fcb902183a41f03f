"""`eval --tasks`: CORE's three task types scored as defined, on bundles in the real layout.

A bigram model whose every choice is known gives hand-computed accuracies; the demo checkpoint
gives the same CORE on 1, 2 and 4 processes; a broken bundle is refused in one line naming the file.
"""

from __future__ import annotations

import json
import re
import sys
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch

WORDS = ["[BOS]", "q", "yes", "no", "maybe", "cat", "dog", "runs", "sits", "x", "y", "z", "w"]
# The model's one preferred next word after each word (all others equally unlikely).
NEXT = {"q": "yes", "cat": "runs", "dog": "sits", "x": "y", "y": "z", "[BOS]": "q"}


class Bigram(torch.nn.Module):
    def __init__(self):
        super().__init__()
        table = torch.zeros(len(WORDS), len(WORDS))
        for word, nxt in NEXT.items():
            table[WORDS.index(word), WORDS.index(nxt)] = 10.0
        self.table = torch.nn.Parameter(table)

    def forward(self, ids):
        return self.table[ids]


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[BOS]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def write_bundle(root, tasks: dict, baselines: dict):
    """tasks: label -> (icl_task_type, num_fewshot, items); the layout of DCLM's and nanochat's bundle."""
    import yaml

    (root / "eval_data").mkdir(parents=True)
    specs = []
    for label, (kind, shots, items) in tasks.items():
        (root / "eval_data" / f"{label}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
        specs.append({"label": label, "dataset_uri": f"{label}.jsonl", "num_fewshot": [shots], "icl_task_type": kind})
    (root / "core.yaml").write_text(yaml.safe_dump({"icl_tasks": specs}))
    rows = "".join(f"{label},{baselines[label]}\n" for label in tasks)
    (root / "eval_meta_data.csv").write_text("Eval Task,Random baseline\n" + rows)
    return root


KNOWN = {
    # the model prefers "yes" after "q": right where gold is "yes" (items 1 and 3), wrong otherwise
    "mc": (
        "multiple_choice",
        0,
        [
            {"query": "q", "choices": ["yes", "no"], "gold": 0},
            {"query": "q", "choices": ["no", "yes"], "gold": 0},
            {"query": "q", "choices": ["no", "yes", "maybe"], "gold": 1},
            {"query": "q", "choices": ["yes", "no"], "gold": 1},
        ],
    ),
    # "runs" follows "cat", "sits" follows "dog": the context that predicts the continuation wins
    "schema": (
        "schema",
        0,
        [
            {"context_options": ["cat", "dog"], "continuation": "runs", "gold": 0},
            {"context_options": ["cat", "dog"], "continuation": "sits", "gold": 1},
            {"context_options": ["cat", "dog"], "continuation": "runs", "gold": 1},
        ],
    ),
    # right only if every continuation token is the greedy one: x -> y -> z
    "lm": (
        "language_modeling",
        0,
        [
            {"context": "x", "continuation": "y z"},
            {"context": "x", "continuation": "y"},
            {"context": "x", "continuation": "y w"},
            {"context": "dog", "continuation": "runs"},
        ],
    ),
}
EXPECTED = {"mc": 2 / 4, "schema": 2 / 3, "lm": 2 / 4}
BASELINES = {"mc": 25.0, "schema": 50.0, "lm": 0.0}


def score(pkg, bundle, wanted=None, max_per_task=None):
    tasks = pkg.tasks.load_bundle(bundle, wanted)
    info = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    tok = word_tokenizer()
    return pkg.tasks.evaluate_tasks(Bigram(), tok, 0, tasks, 16, info, nullcontext(), max_per_task)


def test_each_task_type_scores_as_computed_by_hand(pkg, tmp_path):
    result = score(pkg, write_bundle(tmp_path / "bundle", KNOWN, BASELINES))
    for label, accuracy in EXPECTED.items():
        got = result["tasks"][label]
        b = BASELINES[label] / 100
        assert got["accuracy"] == pytest.approx(accuracy), label
        assert got["centred"] == pytest.approx((accuracy - b) / (1 - b)), label
        assert got["items"] == len(KNOWN[label][2])
    assert result["core"] == pytest.approx(sum(r["centred"] for r in result["tasks"].values()) / 3)
    assert "CORE" in pkg.tasks.table(result)


def test_batching_by_length_gives_the_scores_of_one_row_per_forward(pkg, tmp_path):
    tasks = pkg.tasks.load_bundle(write_bundle(tmp_path / "bundle", KNOWN, BASELINES))
    info = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    scored = [
        pkg.tasks.evaluate_tasks(Bigram(), word_tokenizer(), 0, tasks, 16, info, nullcontext(), None, tokens)
        for tokens in (1, 12, 4096)
    ]
    assert scored[0] == scored[1] == scored[2]
    rows, _ = pkg.tasks.rows_of(word_tokenizer(), 0, tasks, [(0, 0), (2, 0)], 16)
    assert [len(b) for b in pkg.tasks.length_batches(rows, 4096)] == [3]


def test_few_shot_examples_are_fixed_per_item_and_never_the_item(pkg, tmp_path):
    items = [{"query": f"q{i}", "choices": ["a", "b"], "gold": i % 2} for i in range(12)]
    bundle = write_bundle(tmp_path / "bundle", {"mc": ("multiple_choice", 3, items)}, {"mc": 50})
    (task,) = pkg.tasks.load_bundle(bundle)
    for index in range(12):
        opts, gold = pkg.tasks.options(task, index)
        context = opts[0][0]
        shots = context.split("\n\n")[:-1]
        assert len(shots) == 3 and f"q{index} " not in [s[: len(f"q{index} ")] for s in shots]
        assert context.endswith(f"q{index}") and gold == index % 2
        assert pkg.tasks.options(task, index) == (opts, gold)  # the same draw every time
    assert (
        pkg.tasks.chosen_items(task, 5) == pkg.tasks.chosen_items(task, 5) and len(pkg.tasks.chosen_items(task, 5)) == 5
    )


def test_a_prompt_longer_than_the_context_is_cut_from_the_left(pkg):
    tok = word_tokenizer()
    ids, start = pkg.tasks.encode_option(tok, 0, " ".join(["x"] * 30), " y z", limit=8)
    assert len(ids) == 9 and ids[-2:] == [WORDS.index("y"), WORDS.index("z")] and start == 7


BROKEN = {
    "missing bundle": (lambda root: None, "no task bundle at"),
    "unknown type": (lambda root: _spec(root, icl_task_type="cloze"), "icl_task_type 'cloze' is not one of"),
    "missing task file": (lambda root: (root / "eval_data" / "mc.jsonl").unlink(), "mc.jsonl is missing"),
    "gold out of range": (
        lambda root: _items(root, [{"query": "q", "choices": ["a"], "gold": 3}]),
        "mc.jsonl:1: the item gold 3 is out of range",
    ),
    "empty choices": (
        lambda root: _items(root, [{"query": "q", "choices": [], "gold": 0}]),
        "mc.jsonl:1: the item has no choices",
    ),
    "no baseline": (
        lambda root: (root / "eval_meta_data.csv").write_text("Eval Task,Random baseline\n"),
        "no random baseline for task mc",
    ),
    # What a careless edit or another tool's bundle brings (each was a traceback or a silent wrong score).
    "a baseline of nan": (lambda root: _baseline(root, "nan"), "task mc: Random baseline nan is not a percentage"),
    "a baseline of 100": (lambda root: _baseline(root, "100"), "task mc: Random baseline 100 is not a percentage"),
    "a task entry that is text": (
        lambda root: _specs(root, lambda specs: specs + ["mc2"]),
        "icl_tasks entry 'mc2' is not a mapping with a text label",
    ),
    "a label twice": (
        lambda root: _specs(root, lambda specs: specs + specs),
        "task label(s) mc appear more than once",
    ),
    "a query that is a number": (
        lambda root: _items(root, [{"query": 7, "choices": ["a"], "gold": 0}]),
        "mc.jsonl:1: the item query 7 is not text",
    ),
    "a choice that is a number": (
        lambda root: _items(root, [{"query": "q", "choices": ["a", 2], "gold": 0}]),
        "mc.jsonl:1: the item choices holds an option that is not text",
    ),
    "a delimiter of null": (
        lambda root: _spec(root, continuation_delimiter=None),
        "continuation_delimiter None is not text; leave it out for one space",
    ),
    "an empty choice": (
        lambda root: _items(root, [{"query": "q", "choices": ["a", " "], "gold": 0}]),
        "mc.jsonl:1: the item choices holds an empty option: there is nothing to score for it",
    ),
    "num_fewshot [true]": (
        lambda root: _spec(root, num_fewshot=[True]),
        "num_fewshot True is not a whole number >= 0",
    ),
}


def _baseline(root, value: str):
    (root / "eval_meta_data.csv").write_text(f"Eval Task,Random baseline\nmc,{value}\n")


def _specs(root, change):
    import yaml

    spec = yaml.safe_load((root / "core.yaml").read_text())
    spec["icl_tasks"] = change(spec["icl_tasks"])
    (root / "core.yaml").write_text(yaml.safe_dump(spec))


def _spec(root, **change):
    import yaml

    spec = yaml.safe_load((root / "core.yaml").read_text())
    spec["icl_tasks"][0].update(change)
    (root / "core.yaml").write_text(yaml.safe_dump(spec))


def _items(root, items):
    (root / "eval_data" / "mc.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_bundle_is_refused_naming_the_file(case, pkg, tmp_path):
    root = tmp_path / "bundle"
    if case != "missing bundle":
        write_bundle(root, {"mc": KNOWN["mc"]}, {"mc": 25})
    BROKEN[case][0](root)
    with pytest.raises(pkg.config.ConfigError) as refused:
        pkg.tasks.load_bundle(root)
    assert BROKEN[case][1] in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig"])
def test_a_task_file_saved_with_a_byte_order_mark_is_read(encoding, pkg, tmp_path):
    """Through the stored-file reader, as the config is (a Windows editor's UTF-16 was a traceback)."""
    root = write_bundle(tmp_path / "bundle", {"mc": KNOWN["mc"]}, {"mc": 25})
    path = root / "eval_data" / "mc.jsonl"
    path.write_bytes(path.read_text().encode(encoding))
    [task] = pkg.tasks.load_bundle(root)
    assert task.items == KNOWN["mc"][2]


def demo_bundle(root):
    """A few tasks of each type written from ordinary English, in the real layout."""
    words = "the module reads a file and returns the list of names it holds".split()
    mc = [{"query": " ".join(words[i : i + 4]), "choices": words[i + 4 : i + 7], "gold": i % 3} for i in range(6)]
    schema = [
        {"context_options": [words[i], words[i + 1]], "continuation": " ".join(words[i + 2 : i + 5]), "gold": i % 2}
        for i in range(5)
    ]
    lm = [{"context": " ".join(words[i : i + 5]), "continuation": words[i + 5]} for i in range(6)]
    tasks = {"mc": ("multiple_choice", 2, mc), "schema": ("schema", 1, schema), "lm": ("language_modeling", 1, lm)}
    return write_bundle(root, tasks, {"mc": 33.3, "schema": 50, "lm": 0})


def test_core_of_the_demo_checkpoint_is_the_same_on_1_2_and_4_processes(
    run_2proc, demo_data, cli, tmp_path, tiny_model
):
    bundle = demo_bundle(tmp_path / "bundle")
    found = {}
    for nproc in (1, 2, 4):
        out = tmp_path / f"eval{nproc}"
        out.mkdir()
        # a run folder of its own per count (eval.json), reading run_2proc's checkpoint
        ckpt = run_2proc[0] / "checkpoints" / "step_00000030.pt"
        args = ["eval", "--tasks", "core", "--bundle", bundle, "--checkpoint", ckpt, *tiny_model]
        args += [f"data.dir={demo_data}", f"run.output_dir={out}", "run.device=cpu", "run.dtype=fp32"]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
        proc = cli.run([*launcher, "-m", cli.package, *args], timeout=300)
        result = json.loads((out / "eval.json").read_text())
        assert re.search(r"CORE\s+-?\d\.\d{4}", proc.stdout), proc.stdout
        found[nproc] = result
    assert found[1]["tasks"] == found[2]["tasks"] == found[4]["tasks"]
    assert found[1]["core"] == found[2]["core"] == found[4]["core"]
    assert {label: s["items"] for label, s in found[1]["tasks"].items()} == {"mc": 6, "schema": 5, "lm": 6}


@pytest.mark.part("bert")
def test_bert_refuses_tasks_in_one_line(cli, demo_data, tmp_path):
    proc = cli("eval", "--tasks", "core", "model.arch=bert", "model.pretrained=", f"data.dir={demo_data}", expect=1)
    assert "masked" in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_a_task_list_that_names_no_task_is_one_line(cli, demo_data, tiny_model):
    """`--tasks ','` scored every task of the bundle as if asked for `core`."""
    proc = cli("eval", "--tasks", ",", *tiny_model, f"data.dir={demo_data}", expect=1)
    assert proc.stderr.strip() == "error: --tasks ',' names no task; give 'core' (every task) or labels a,b"


@pytest.mark.parametrize("kind", ["lm", "schema"])
def test_an_item_with_an_empty_continuation_is_one_line_naming_its_file_and_line(
    run_2proc, demo_data, cli, tmp_path, tiny_model, kind
):
    """Nothing to score: no token (a traceback from the loss), or only the delimiter (a score of how
    often a space comes next). Refused before any item is scored, naming the file and its line;
    eval.json is not written."""
    bundle = demo_bundle(tmp_path / "bundle")
    path = bundle / "eval_data" / f"{kind}.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = json.dumps({**json.loads(lines[3]), "continuation": ""})
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    out.mkdir()
    ckpt = run_2proc[0] / "checkpoints" / "step_00000030.pt"
    args = ["eval", "--tasks", "core", "--bundle", bundle, "--checkpoint", ckpt, *tiny_model, f"data.dir={demo_data}"]
    proc = cli(*args, f"run.output_dir={out}", "run.device=cpu", expect=1)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (
        f"error: {path}:4: the item continuation '' is empty: there is nothing to score; correct or remove that line"
    ), proc.stderr
    assert list(out.iterdir()) == []


def test_a_continuation_the_tokenizer_drops_is_named_by_its_file_and_line(pkg, tmp_path):
    """A continuation of characters the tokenizer leaves out adds no token to its context: the item is
    named instead of scoring the loss of nothing."""
    from tokenizers import normalizers

    items = [{"context": "x", "continuation": "y"}, {"context": "x", "continuation": "~~"}]
    root = write_bundle(tmp_path / "bundle", {"lm": ("language_modeling", 0, items)}, {"lm": 0})
    tasks = pkg.tasks.load_bundle(root)
    tok = word_tokenizer()
    tok.normalizer = normalizers.Replace("~", "")
    info = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))
    with pytest.raises(pkg.config.ConfigError) as refused:
        pkg.tasks.evaluate_tasks(Bigram(), tok, 0, tasks, 16, info, nullcontext())
    assert str(refused.value).startswith(f"{root / 'eval_data' / 'lm.jsonl'}:2: the item cannot be scored: "), refused
    assert "adds no token" in str(refused.value)


def test_a_result_that_is_not_finite_leaves_eval_json_as_it_was(pkg):
    assert pkg.evaluate.all_finite({"core": 0.1, "tasks": {"mc": {"centred": [0.2, 1]}}})
    assert not pkg.evaluate.all_finite({"core": 0.1, "tasks": {"mc": {"centred": float("nan")}}})


def test_training_logs_every_task_and_core_at_the_task_steps(cli, demo_data, tmp_path, train):
    """eval.tasks_every_steps scores the demo's bundle (prepare-data --demo-corpus writes it) during a
    2-process run: per-task centred accuracy and CORE in metrics.jsonl and TensorBoard at those steps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert (demo_data / "eval_bundle" / "core.yaml").is_file()
    out = tmp_path / "run"
    proc = train(
        cli, demo_data, out, 2, "eval.tasks_every_steps=10", "eval.tasks_max_per_task=6", "schedule.max_steps=20"
    )
    assert re.search(r"step +10/20 \| CORE -?\d\.\d{4} \(3 tasks\)", proc.stdout), proc.stdout[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    scored = [r for r in records if "core" in r]
    assert [r["step"] for r in scored] == [10, 20]
    labels = {"docstring_next_word", "docstring_next_words", "docstring_opening"}
    assert {key for key in scored[0] if key.startswith("tasks/")} == {f"tasks/{label}" for label in labels}
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"core", *(f"tasks/{label}" for label in labels)} <= tags
    assert [e.step for e in events.Scalars("core")] == [10, 20]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        pytest.param(
            ["model.arch=bert", "model.size=tiny", "model.sequence_len=64"],
            "model.arch=bert is masked",
            marks=pytest.mark.part("bert"),
        ),
        (["eval.tasks_every_steps=-1"], "eval.tasks_every_steps=-1"),
        (["eval.tasks_max_per_task=0"], "eval.tasks_max_per_task=0"),
    ],
)
def test_task_settings_are_refused_where_they_cannot_run(overrides, needle, pkg, cfg_with):
    cfg = cfg_with("eval.tasks_every_steps=10", "model.pretrained=", *overrides)
    problems = pkg.rules.check_config(cfg)
    assert any(needle in p for p in problems), problems

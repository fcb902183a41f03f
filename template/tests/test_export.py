"""`export`: a checkpoint as a folder transformers loads, computing what our model computes.

The gpt run here (run_2proc: DDP, 2 processes) is exported to NanoChatForCausalLM; the DeepSpeed,
gpt3 and bert suites export their own checkpoints (ZeRO-3 with and without offload, tensor x
pipeline shards, BERT) with the same checks.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest
import torch
from conftest import subprocess_env

PROMPT = "The module"


def ours_and_theirs(pkg, cfg_with, overrides, folder, checkpoint=None, **load):
    """Our model from the checkpoint, and transformers' from the export (both fp32, eval mode);
    load: from_pretrained's options."""
    import transformers

    cfg = cfg_with(*overrides)
    model, _, _, cfg = pkg.trained_model.load_trained_model(cfg, checkpoint, torch.device("cpu"))
    causal = pkg.family.family(cfg.model.arch).causal
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModelForMaskedLM
    return model.float().eval(), auto.from_pretrained(str(folder), **load).eval(), cfg


def assert_same_logits(model, hf, vocab_size: int, length: int, atol: float = 1e-4) -> None:
    ids = torch.randint(5, vocab_size, (3, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max().item() < atol


def assert_greedy_like_sample(cli, hf, folder, overrides) -> None:
    """transformers' greedy generate of 32 tokens writes the text `sample --temperature 0` prints."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok(PROMPT)["input_ids"]
    assert ids[0] == tok.bos_token_id  # the exported tokenizer starts a text as training documents start
    new = hf.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32, do_sample=False)[0, len(ids) :]
    printed = cli("sample", "--prompt", PROMPT, "--temperature", "0", "--max-new-tokens", "32", *overrides).stdout
    text = re.search(rf"--- {PROMPT!r}\n(.*)\n\n", printed, re.S).group(1)
    assert text == PROMPT + tok.decode(new.tolist())


@pytest.fixture(scope="module")
def gpt_export(run_2proc, demo_data, export, tiny_model):
    return export(demo_data, run_2proc[0], *tiny_model)


def test_gpt_export_is_nanochat_with_our_logits_and_greedy_tokens(
    gpt_export, run_2proc, demo_data, cli, pkg, cfg_with, tiny_model
):
    overrides = [
        *tiny_model,
        f"data.dir={demo_data}",
        f"run.output_dir={run_2proc[0]}",
        "run.device=cpu",
        "run.dtype=fp32",
    ]
    model, hf, cfg = ours_and_theirs(pkg, cfg_with, overrides, gpt_export)
    assert type(hf).__name__ == "NanoChatForCausalLM"
    assert hf.num_parameters() == model.num_params()
    assert_same_logits(model, hf, model.config.vocab_size, cfg.model.sequence_len)
    assert_greedy_like_sample(cli, hf, gpt_export, overrides)


def test_a_padded_vocabulary_exports_its_rows_only(pkg, cfg_with, tmp_path):
    """model.vocab_multiple pads the tables; NanoChatForCausalLM gets the vocabulary's rows, and its
    logits (saved and loaded again) equal ours."""
    import transformers

    torch.manual_seed(0)
    cfg = cfg_with("model.size=tiny", "model.sequence_len=32", "model.vocab_multiple=64")
    model = pkg.models.build_model(cfg, 300).eval()
    with torch.no_grad():
        for p in model.parameters():  # the zero-initialised projections would hide a mistake
            p.add_(torch.randn_like(p) * 0.05)
    assert model.lm_head.weight.shape[0] == 320
    pkg.module("models.gpt.build").to_transformers(model).save_pretrained(tmp_path / "padded")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "padded")).eval()
    assert hf.config.vocab_size == 300
    assert_same_logits(model, hf, 300, 32)


def test_export_folder_names_its_source(gpt_export, run_2proc, demo_data, pkg):
    readme = (gpt_export / "README.md").read_text()
    assert "| step | 30 |" in readme
    assert pkg.tokens.data_fingerprint(demo_data) in readme
    assert str(run_2proc[0] / "checkpoints" / "step_00000030.pt") in readme
    assert {p.name for p in gpt_export.iterdir()} >= {"model.safetensors", "config.json", "tokenizer.json"}


def test_export_into_a_folder_holding_files_is_refused_and_leaves_it(run_2proc, demo_data, cli, tmp_path, tiny_model):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = cli("export", out, f"data.dir={demo_data}", f"run.output_dir={run_2proc[0]}", *tiny_model, expect=1)
    assert proc.stderr.strip().count("\n") == 0 and "is not empty" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]


STOPS = {
    "SIGTERM": [signal.SIGTERM],
    "SIGHUP": [signal.SIGHUP],
    "SIGQUIT": [signal.SIGQUIT],  # Ctrl-\: it dumped core and left the partial folder
    # A second stop while the first removes the partial folder, or once it has (the process exiting:
    # it was "Exception ignored in atexit" and a traceback)
    "Ctrl-C twice": [signal.SIGINT, signal.SIGINT],
    "SIGTERM twice, the second at once": [signal.SIGTERM, signal.SIGTERM],
    "SIGTERM, then SIGTERM as it exits": [signal.SIGTERM, "cleaned", signal.SIGTERM],
    "SIGINT, then SIGHUP as it exits": [signal.SIGINT, "cleaned", signal.SIGHUP],
}


@pytest.mark.parametrize("stops", STOPS)
def test_a_stop_signal_during_an_export_leaves_nothing_as_ctrl_c_does(
    run_2proc, demo_data, cli, tmp_path, tmp_path_factory, tiny_model, stops
):
    """A scheduler's stop or a closed terminal in the middle of the save (runtime/process_exit.py): the
    partial folder, as large as the model, is removed; one line; 128 + the first signal's number. A
    second signal changes nothing of that, whenever it comes."""
    out = tmp_path / "export"
    args = cli.command("export", out, f"data.dir={demo_data}", f"run.output_dir={run_2proc[0]}", *tiny_model)
    env = subprocess_env({"TRAIN_FAULT_PAUSE_BEFORE_COMMIT": "60"})
    errors = tmp_path_factory.mktemp("export-stderr") / "stderr"  # outside tmp_path, which must end empty
    with open(errors, "w") as err:
        proc = subprocess.Popen(
            args,
            cwd=cli.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's Ctrl-C reaches it
        )
    try:
        # The pause's own message (faults.pause_before_commit), printed once the partial folder is written.
        deadline = time.monotonic() + 180
        while "pausing 60 s before the rename" not in errors.read_text():
            assert proc.poll() is None, f"the export exited ({proc.returncode}) before its pause:\n{errors.read_text()}"
            assert time.monotonic() < deadline, f"the export never reached its pause:\n{errors.read_text()}"
            time.sleep(0.1)
        for stop in STOPS[stops]:
            if stop == "cleaned":  # the partial folder removed: the process is on its way out
                while any(tmp_path.iterdir()) and proc.poll() is None:
                    time.sleep(0.01)
            else:
                proc.send_signal(stop)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = errors.read_text()
    first = STOPS[stops][0]
    assert proc.returncode == 128 + first, (proc.returncode, stdout, stderr)
    said = "interrupted" if first == signal.SIGINT else f"stopped by {signal.Signals(first).name}"
    assert stderr.strip().splitlines()[-1] == f"export: {said}", stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())

"""`export OUT_DIR`: a trained checkpoint as a folder transformers loads, for any other tool.

    <package> export exports/latest                                        # the latest checkpoint
    <package> export exports/step1000 --checkpoint runs/checkpoints/step_00001000

    AutoModelForCausalLM.from_pretrained("exports/latest")   # a causal family (gpt: NanoChatForCausalLM)
    AutoModelForMaskedLM.from_pretrained("exports/latest")   # a masked-LM family
    AutoTokenizer.from_pretrained("exports/latest")

The checkpoint of any strategy (a replica, shards of any stage, pipeline and tensor layouts) is read
in one process by trained_model.py, so the weights are the same whatever layout trained them; the
family's exporter (its descriptor) converts them to the transformers architecture that computes
exactly what ours does. The folder holds model.safetensors, config.json, the tokenizer (ours, with
the special tokens the family names; a causal model's encodings start with the document separator,
as its training documents did) and a README naming the run, step, data fingerprint and commit. It is
written beside OUT_DIR and renamed into place when complete: an interrupted export leaves nothing
under the name.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

import torch

from ..data.tokens import bos_id, data_fingerprint, data_tokenizer
from ..models.family import Family, family
from ..runtime import faults
from ..settings.config import Config, ConfigError, project_root
from .trained_model import load_trained_model


def transformers_tokenizer(tok, fam: Family):
    """Our tokenizers.Tokenizer as a transformers fast tokenizer with its special tokens named: a
    masked LM's as its family names them, a causal model's separator as its BOS and EOS."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(tok.to_str())  # a copy: the post-processor below is the export's
    if not fam.causal:
        named = {key: token for key, token in fam.special_tokens.items() if tok.token_to_id(token) is not None}
        return PreTrainedTokenizerFast(tokenizer_object=tok, **named)
    bos = tok.id_to_token(bos_id(tok))
    # Training documents start with the separator (data/tokens.py): so do the export's encodings.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=bos)


def _require_transformers() -> None:
    """Refuse in one line, before reading a checkpoint, where transformers is missing or too old."""
    try:
        import transformers
    except ImportError:
        transformers = None
    if transformers is None or int(transformers.__version__.split(".")[0]) < 5:
        found = f"transformers {transformers.__version__}" if transformers else "no transformers"
        raise ConfigError(f"export needs transformers 5 or newer ({found} here); pip install -e '.[export]'")


def _commit() -> str:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=project_root(), capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (git is not available)"
    return found.stdout.strip() if found.returncode == 0 else "unknown (not a git checkout)"


def _readme(cfg: Config, hf, checkpoint: Path, step: int, fingerprint: str) -> str:
    kind = "AutoModelForCausalLM" if family(cfg.model.arch).causal else "AutoModelForMaskedLM"
    return (
        f"# {cfg.model.arch} {cfg.model.size}, step {step}\n\n"
        f"Exported from a training run for use with transformers ({type(hf).__name__}).\n\n"
        "```python\n"
        f"from transformers import AutoTokenizer, {kind}\n"
        f'model = {kind}.from_pretrained("<this folder>")\n'
        'tokenizer = AutoTokenizer.from_pretrained("<this folder>")\n'
        "```\n\n"
        "| | |\n|---|---|\n"
        f"| run | {cfg.run.output_dir} |\n"
        f"| checkpoint | {checkpoint} |\n"
        f"| step | {step} |\n"
        f"| data fingerprint | {fingerprint} (data.dir={cfg.data.dir}) |\n"
        f"| commit | {_commit()} |\n"
        f"| parameters | {sum(p.numel() for p in hf.parameters()):,} |\n"
    )


def export(cfg: Config, out_dir: str | Path, ckpt: str | None = None) -> Path:
    """Write the folder; return its path. A folder that exists and holds files is refused."""
    out = Path(out_dir).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export folder {out} exists and is not empty; give a new or an empty folder")
    _require_transformers()
    model, step, path, cfg = load_trained_model(cfg, ckpt, torch.device("cpu"))
    fam = family(cfg.model.arch)
    hf = fam.to_transformers(model.float().eval())
    data_dir = Path(cfg.data.dir)
    tok = transformers_tokenizer(data_tokenizer(data_dir), fam)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        hf.save_pretrained(partial, safe_serialization=True)
        tok.save_pretrained(partial)
        (partial / "README.md").write_text(_readme(cfg, hf, path, step, data_fingerprint(data_dir)))
        faults.pause_before_commit(partial)
        if out.exists():
            out.rmdir()
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    print(f"exported {path} (step {step}) as {type(hf).__name__} to {out}", flush=True)
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out_dir", help="folder to write (new, or empty)")
    p.add_argument("--checkpoint", help="checkpoint file or folder (default: latest)")


def run(cfg: Config, args: argparse.Namespace) -> int:
    export(cfg, args.out_dir, args.checkpoint)
    return 0

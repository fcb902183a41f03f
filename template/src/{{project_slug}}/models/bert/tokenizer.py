"""bert's tokenizer: lower-cased WordPiece with BERT's special tokens (bert-base-uncased style),
trained by prepare-data (the descriptor's tokenizer_trainer) or read from a vocab.txt (its
tokenizer_files); the tokenizers library is imported only when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from ...settings.config import ConfigError
from ...settings.packages import import_transformers
from .descriptor import FAMILY

SPECIALS = list(FAMILY.special_tokens.values())  # [PAD] [UNK] [CLS] [SEP] [MASK], in id order


def _wordpiece(vocab: dict[str, int] | None = None):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]") if vocab else models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def _wordpiece_trainer(vocab_size: int, special_tokens: list[str]):
    from tokenizers import trainers

    return trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, min_frequency=2, show_progress=False
    )


def train_wordpiece(read_sample: Callable[[str], Iterator[str]], vocab_size: int):
    """A WordPiece tokenizer trained on the texts of read_sample(purpose), a fresh pass over the same
    sample each call. The same sample gives the same tokenizer, token ids included, on any machine."""
    from tokenizers import processors

    # The library's trainer numbers the "##" continuation letters in hash-map order, new on every
    # run, and those numbers break ties between equally frequent merges: the same text gave other
    # token ids, and at times other tokens (huggingface/tokenizers#1794). A first pass that merges
    # nothing lists the letters; the real pass gets them in sorted order, ahead of any merge.
    alphabet = _wordpiece()
    alphabet.train_from_iterator(read_sample("the tokenizer's letters"), trainer=_wordpiece_trainer(1, SPECIALS))
    letters = sorted(t for t in alphabet.get_vocab() if t.startswith("##") and len(t) == 3)
    trained = _wordpiece()
    # Special tokens first, so [PAD] is id 0: BertConfig's default pad_token_id.
    trained.train_from_iterator(
        read_sample("the tokenizer"), trainer=_wordpiece_trainer(vocab_size, SPECIALS + letters)
    )
    # The letters were special only to fix their ids: the tokenizer proper has BERT's five.
    tok = _wordpiece(trained.get_vocab())
    tok.add_special_tokens(SPECIALS)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    # What transformers' BERT tokenizers add around a text; training adds them itself (data.py).
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def read_vocab(vocab: Path):
    """A BERT vocab.txt as transformers' BertTokenizerFast reads it (the folder's tokenizer_config.json,
    do_lower_case and special tokens, applies where the file is named vocab.txt)."""
    transformers = import_transformers("a tokenizer folder's tokenizer (tokenizer.json, vocab.txt)")
    try:
        if vocab.name == "vocab.txt":
            fast = transformers.BertTokenizerFast.from_pretrained(str(vocab.parent), local_files_only=True)
        else:
            fast = transformers.BertTokenizerFast(vocab_file=str(vocab))
    except Exception as exc:  # tokenizers raises a bare Exception on a file it cannot read (not UTF-8)
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"tokenizer {vocab} could not be read ({first_line}); give a vocab.txt of one token a line, in UTF-8",
            key="data.tokenizer",
        ) from None
    # WordPiece maps every word it cannot split to its unknown token; a vocabulary without it makes the
    # tokenizer raise on the first such word, inside prepare-data's workers.
    unknown = fast.unk_token or "[UNK]"
    # (the tokenizer adds a missing one as a special token, which WordPiece's own vocabulary still lacks)
    if unknown not in {line.strip() for line in vocab.read_text(encoding="utf-8", errors="replace").splitlines()}:
        raise ConfigError(
            f"{vocab} has no {unknown} line: WordPiece needs its unknown token for words it cannot split; "
            f"add a line {unknown} (BERT's vocabularies have it at id 100), or use the model's own vocab.txt",
            key="data.tokenizer",
        )
    return fast.backend_tokenizer

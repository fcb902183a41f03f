"""A split's batches for the run's family: its own where its descriptor names them (a masked LM's
predicted positions, models/<family>/), else next-token pairs of the token stream (tokens.py), or
rows that start at a document (document_rows.py, data.rows=documents) for training."""

from __future__ import annotations

from pathlib import Path

from ..models.family import family
from .document_rows import DocumentRows
from .tokens import PreparedSplit, TokenData


def open_split(cfg, data_dir: Path, split: str, fam=None):
    """Inputs and targets of one split: the family's own batches where its descriptor names them, else
    next-token pairs. fam: the run's family (Run.family), else cfg's is looked up."""
    fam = fam or family(cfg.model.arch)
    if fam.batches:
        return fam.open_batches(cfg, PreparedSplit.open(Path(data_dir), split))
    if cfg.data.rows == "documents" and split == "train":
        return DocumentRows.open(data_dir, split, cfg.model.sequence_len)
    return TokenData.open(data_dir, split, cfg.model.sequence_len)

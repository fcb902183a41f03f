"""Checkpoints, in one place: writing them atomically with a manifest and keeping the last K
(checkpoint.py), reading and verifying them on disk without torch (checkpoint_files.py), and
continuing one on another data-parallel size or layout through DeepSpeed's universal format
(universal_checkpoint.py). Each strategy (strategies/) reads back the weights of the format it writes."""

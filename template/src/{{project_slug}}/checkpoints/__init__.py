"""Checkpoints, in one place: writing them atomically with a manifest and keeping the last K
(checkpoint.py), reading and verifying them on disk without torch (checkpoint_files.py), and
continuing one on another data-parallel size or layout (a sharded strategy converts its own). Each strategy (strategies/) reads back the weights of the format it writes."""

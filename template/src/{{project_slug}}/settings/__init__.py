"""Settings, in plain Python (no torch): the typed config, the bounds of every number, the rules
that relate settings, the GPUs and sizes the project knows, the precision a run computes in, and
where the project's own files are. Everything `check` runs lives here or asks here.
"""

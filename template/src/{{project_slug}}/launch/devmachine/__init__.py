"""`launch devmachine`: platform.py (torchrun on this machine, or on several started by hand; its
job's status, logs and cancel from the run's folder)."""

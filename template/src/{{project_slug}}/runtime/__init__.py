"""What every process of a run stands on: the process group and device, failures a restart
cannot fix, fault injection, and checkpoints (atomic writes, finding the newest intact one).
"""

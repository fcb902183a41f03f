"""What a config costs before it runs, without torch: parameters, FLOPs, memory per GPU, whether
it fits and the smallest change that makes it fit, time on more nodes (`plan`), and `check`.
"""

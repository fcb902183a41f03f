"""`launch tione`: platform.py (the API client, the actions, the Platform), request.py (TI-ONE's
CreateTrainingTask request from task.yaml, checked), console.py (TI-ONE's console settings),
environment.py (what each mode injects: DDP, MPI, Ray, PS-Worker), ray_train.py (`ray-train`: Ray
Train's TorchTrainer over the Ray cluster of TI-ONE's Ray mode)."""

COMMANDS = {"ray-train": ("ray_train", "train on a running Ray cluster with Ray Train (TI-ONE Ray mode)")}

"""The nanochat-style GPT family: descriptor.py (torch-free), model.py, pieces.py, build.py, export.py."""

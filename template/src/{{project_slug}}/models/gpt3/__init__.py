"""The GPT-3 family: descriptor.py (the paper's sizes and the seeds' layouts, torch-free), model.py (its layers and pipeline)."""

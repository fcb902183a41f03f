"""The BERT masked-LM family: descriptor.py (torch-free), model.py (transformers' BertForMaskedLM)."""

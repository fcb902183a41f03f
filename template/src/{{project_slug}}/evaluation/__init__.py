"""A trained model, judged and used: loading it from any strategy's checkpoint, validation loss
and bits per byte (`eval`), and generation (`sample`).
"""

"""Data: `prepare-data` (documents, parts encoded on every core, staging, progress) and the token
stream training reads (packed shards, masked-LM batches).
"""

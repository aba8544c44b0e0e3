"""TensorFlow's room: its kernels and runner, and what only it has (oneDNN, int8 through TFLite, the Apple
GPU through Metal, a quiet start). Imports nothing when imported: see
`bgem3_embeddings/backends/__init__.py`."""

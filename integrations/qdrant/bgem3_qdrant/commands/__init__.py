"""The `bgem3-qdrant` commands, one module each; `bgem3_qdrant/cli.py` registers them on the app.

Each module imports its heavy dependencies (TensorFlow through the encoder, qdrant-client through a store)
inside its command function, so `--help` and the checks of the options stay fast.
"""

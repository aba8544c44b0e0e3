"""scikit-learn as a user's install has it: not installed.

Only the reference pulls it in (FlagEmbedding -> sentence-transformers -> scikit-learn), and Keras imports it
whenever it is installed (keras.wrappers): `import keras` took 1.3 s more CPU with it (2-vCPU EPYC), in every
fresh process. tests/support.py puts this folder first on PYTHONPATH for the commands it runs as a user does.
"""

raise ImportError("No module named 'sklearn'", name="sklearn")

"""JAX as the default install has it: not installed (the `jax` extra adds it).

TensorFlow imports JAX whenever it is installed (tensorflow/lite/python/util.py): 0.8 s more per fresh
process on the TensorFlow backend (2-vCPU EPYC, `python -X importtime -c "import tensorflow"`), for nothing a
TensorFlow user runs. tests/support.py puts this folder first on PYTHONPATH for the commands it runs as a
user does, when their Keras backend is TensorFlow (the default); JAX runs stay as they were.
"""

raise ImportError("No module named 'jax'", name="jax")

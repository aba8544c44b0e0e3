"""JAX's room: cuDNN's flash attention and the jit runner over bucketed shapes
(`bgem3_embeddings/backends`)."""

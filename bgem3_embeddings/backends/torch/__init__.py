"""PyTorch's room: the layer in torch ops with oneDNN's fused linear, and the eager runner
(`bgem3_embeddings/backends`)."""

"""What every backend shares: the math in keras.ops and the runners' common pieces
(`bgem3_embeddings/backends`). Imports no backend's room."""

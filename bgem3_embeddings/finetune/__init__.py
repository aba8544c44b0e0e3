"""Fine-tuning BGE-M3 on the user's own retrieval data, as FlagEmbedding's M3 trainer does, in Keras: the
training data (`data`: reading FlagEmbedding's JSON-lines files, sampling each query's group of passages, the
seeded epoch order), its tokenized batches (`batches`), the loss and the training loop."""

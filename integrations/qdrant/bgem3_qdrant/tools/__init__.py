"""Commands beside the main job: `bench` (ingest throughput), `bench-store` (engines side by side),
`migrate` (a local-mode store to Qdrant Edge)."""

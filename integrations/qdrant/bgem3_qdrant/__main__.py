"""`python -m bgem3_qdrant` = the `bgem3-qdrant` command."""

from bgem3_qdrant.cli import main

main()

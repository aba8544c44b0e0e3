"""Local RAG prototype on a Mac: BGE-M3 + embedded Qdrant + LangChain, nothing leaves the machine.

    pip install -e . -e "integrations/qdrant" -e "integrations/langchain[qdrant]"
    pip install -e ".[metal]"                    # optional: Apple GPU via tensorflow-metal
    pip install langchain-ollama && ollama pull llama3.2   # optional: a local LLM writes the answer

    python examples/langchain_mac_rag.py ~/notes "what did we decide about the Q3 budget?"
    python examples/langchain_mac_rag.py ~/notes              # interactive: one question per line

1. Indexes a folder of notes (*.md, *.txt) into the embedded Qdrant at --store, with BGE-M3 dense, sparse
   and ColBERT vectors (bgem3-qdrant schema). Re-running only encodes notes that changed.
2. Answers questions with an LCEL chain: BGEM3Retriever (dense + sparse candidates, ColBERT rerank in one
   Qdrant query) -> prompt -> local chat model. Without a chat model it prints the retrieved context.

Environment: BGEM3_MODEL (hub id or local checkpoint; default BAAI/bge-m3), BGEM3_DEVICE (default auto:
the Apple GPU when tensorflow-metal is installed, else CPU), OLLAMA_MODEL (default llama3.2).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from langchain_bgem3 import BGEM3Embeddings, BGEM3QdrantIndex
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableLambda, RunnablePassthrough

NOTE_SUFFIXES = {".md", ".markdown", ".txt"}
PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question using only the notes below. Cite notes as [n]. If the notes do not "
               "contain the answer, say so.\n\nNotes:\n{context}"),
    ("human", "{question}"),
])


def load_notes(folder: Path) -> list[Document]:
    """One Document per note file; the index cuts long notes into token chunks itself."""
    docs = []
    for path in sorted(folder.rglob("*")):
        if path.suffix.lower() in NOTE_SUFFIXES and path.is_file() and not path.name.startswith("."):
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.strip():
                rel = path.relative_to(folder).as_posix()
                # The relative path is the id: an edited note replaces its old chunks.
                docs.append(Document(id=rel, page_content=text, metadata={"source": rel}))
    return docs


def format_context(docs: list[Document]) -> str:
    """Numbered notes with their source and ColBERT score, for the prompt (or for reading)."""
    parts = []
    for i, d in enumerate(docs, 1):
        score = d.metadata.get("colbert_score", 0.0)
        parts.append(f"[{i}] {d.metadata.get('source')} (colbert {score:.3f})\n{d.page_content}")
    return "\n\n".join(parts)


def local_chat_model(disabled: bool) -> Any | None:
    """A local chat model if an integration is installed (langchain-ollama), else None."""
    if disabled:
        return None
    try:
        from langchain_ollama import ChatOllama
    except ImportError:
        return None
    return ChatOllama(model=os.environ.get("OLLAMA_MODEL", "llama3.2"), temperature=0)


def build_chain(retriever: Runnable, llm: Any | None) -> Runnable:
    """question -> answer (with an LLM) or -> the retrieved context, as one LCEL chain."""
    inputs = {"context": retriever | RunnableLambda(format_context), "question": RunnablePassthrough()}
    context_only = inputs | RunnableLambda(
        lambda x: f"Context for: {x['question']}\n\n{x['context']}"
    )
    if llm is None:
        return context_only
    # If the local model server is not running, show the retrieved context instead of failing.
    return (inputs | PROMPT | llm | StrOutputParser()).with_fallbacks([context_only])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notes", type=Path, help="folder of .md / .txt notes")
    ap.add_argument("question", nargs="*", help="question (interactive when omitted)")
    ap.add_argument("--store", default=os.path.expanduser("~/.cache/bgem3/langchain_rag"),
                    help="embedded Qdrant folder")
    ap.add_argument("--collection", default="notes")
    ap.add_argument("-k", type=int, default=4, help="notes passed to the answer")
    ap.add_argument("--no-llm", action="store_true", help="only print the retrieved context")
    args = ap.parse_args(argv)
    if not args.notes.is_dir():
        ap.error(f"{args.notes} is not a folder")

    from bgem3_qdrant import open_store, resolve_target

    model = os.environ.get("BGEM3_MODEL", "BAAI/bge-m3")
    embeddings = BGEM3Embeddings(model_name=model,
                                 model_kwargs={"device": os.environ.get("BGEM3_DEVICE", "auto")})
    encoder = embeddings.encoder  # one model for indexing, retrieval (and any other component)
    device = getattr(getattr(encoder, "device", None), "kind", "?")
    print(f"model {model} on {device}, precision {getattr(encoder, 'precision', '?')}",
          file=sys.stderr)

    client = open_store(resolve_target(path=args.store))
    try:
        index = BGEM3QdrantIndex(client=client, collection_name=args.collection, encoder=encoder,
                                 show_progress=True)
        docs = load_notes(args.notes)
        index.add_documents(docs)
        print(f"indexed {len(docs)} notes into {args.store} ({args.collection})", file=sys.stderr)

        chain = build_chain(index.as_retriever(k=args.k), local_chat_model(args.no_llm))
        questions = [" ".join(args.question)] if args.question else (line.strip() for line in sys.stdin)
        if not args.question:
            print("ask a question per line (Ctrl-D to quit)", file=sys.stderr)
        for question in questions:
            if question:
                print(chain.invoke(question), flush=True)
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

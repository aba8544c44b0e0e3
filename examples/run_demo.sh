#!/usr/bin/env bash
# The README's demo command (`make demo`): ingest examples/corpus into the embedded Qdrant store with
# BGE-M3 dense + sparse + ColBERT vectors, then run hybrid searches (dense + sparse candidates,
# ColBERT rerank) and print the hits.
#
# Environment (set by the Makefile, all optional here):
#   BGEM3_MODEL  hub id (default BAAI/bge-m3), a local checkpoint folder, or "tiny": a random tiny
#                checkpoint the commands generate once into the user's cache (offline; every step runs,
#                its rankings are random)
#   PY, PIP      the Python and pip to use (default: python3, $PY -m pip)
#   TORCH_PIN    torch requirement for generating the tiny checkpoint (default torch==2.13.0; never
#                unpinned: that pulls gigabytes of CUDA packages)
#   QDRANT_PATH  embedded store folder (default ./qdrant_data: a Qdrant Edge store); QDRANT_URL switches
#                to a server. TensorFlow start-up lines are hidden by the CLI (set TF_CPP_MIN_LOG_LEVEL
#                to see them)
#   BGEM3_DEMO_COLLECTION  the collection (default: one per model, see below)
#   BGEM3_TINY_DIR         where the model name `tiny` is generated (default ~/.cache/bgem3_embeddings/tiny,
#                          bgem3_embeddings/checkpoint/tiny.py)
#
# A collection holds one model's vectors, so each model gets its own demo collection: bgem3-demo for
# BAAI/bge-m3, bgem3-demo-tiny for the tiny checkpoint, bgem3-demo-NAME for another model (NAME: its
# folder or hub name). A tiny demo, then the real one, then the tiny one again all just work.
#
# `run_demo.sh --clean` (`make clean-demo`) drops the demo collections (bgem3-demo*) from the store and
# removes the tiny checkpoints; your own collections and the venv stay.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-python3}"
PIP="${PIP:-$PY -m pip}"
TORCH_PIN="${TORCH_PIN:-torch==2.13.0}"
MODEL="${BGEM3_MODEL:-BAAI/bge-m3}"
STORE="${QDRANT_PATH:-./qdrant_data}"
TINY="${BGEM3_TINY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/bgem3_embeddings/tiny}"  # where `tiny` is generated

# The demo collection of a model (the default model keeps the name the README uses).
demo_collection() {
    case "$1" in
        BAAI/bge-m3) echo "bgem3-demo" ;;
        tiny) echo "bgem3-demo-tiny" ;;
        *)
            local name
            name="$(basename "${1%/}" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9_\n-' '-')"
            echo "bgem3-demo-${name:-model}"
            ;;
    esac
}

if [ "${1:-}" = "--clean" ]; then
    echo "== dropping the demo collections (bgem3-demo*) from $STORE; removing $TINY"
    [ -d "$STORE" ] && $PY - "$STORE" <<'PYTHON'
import sys

from bgem3_qdrant import open_store, resolve_target
from bgem3_qdrant.errors import BGEM3QdrantError

try:
    with open_store(resolve_target(path=sys.argv[1])) as store:
        for name in store.list_collections():
            if name == "bgem3-demo" or name.startswith("bgem3-demo-"):
                store.delete_collection(name)
                print(f"  dropped {name}")
except BGEM3QdrantError as err:  # e.g. the store is open in another process: say so, in one line
    sys.exit(f"error: {err}")
PYTHON
    rm -rf "$TINY"
    exit 0
fi

COLLECTION="${BGEM3_DEMO_COLLECTION:-$(demo_collection "$MODEL")}"

if [ "$MODEL" = "tiny" ]; then
    # The commands generate it on first use (with a line saying so); that needs torch and sentencepiece.
    if [ ! -f "$TINY/bge-m3/config.json" ]; then
        echo "== installing what generating the tiny random model needs: $TORCH_PIN, sentencepiece"
        $PIP install -q "$TORCH_PIN" "sentencepiece>=0.2"
    fi
    CHUNK=(--chunk-size 64 --chunk-overlap 8)
else
    CHUNK=(--chunk-size 512 --chunk-overlap 64)
fi

run() { $PY -m bgem3_qdrant "$@"; }

echo "== ingesting examples/corpus into '$COLLECTION' ($STORE) with $MODEL"
if ! run ingest examples/corpus --collection "$COLLECTION" --model "$MODEL" --path "$STORE" "${CHUNK[@]}"; then
    if [ "$MODEL" = "BAAI/bge-m3" ]; then
        echo "  no Hugging Face hub here? BGEM3_MODEL=tiny make demo runs offline on a generated tiny checkpoint" >&2
    fi
    echo "  another collection: make demo BGEM3_DEMO_COLLECTION=NAME; start over: make clean-demo" >&2
    exit 1
fi

echo
echo "== hybrid search: dense + sparse candidates in one Query API call, reranked by ColBERT"
if [ "$MODEL" = "tiny" ]; then  # its scores look like real ones: say once what they are
    echo "   (the tiny model's weights are random, so its rankings below are random too: they show every step"
    echo "   runs, not what BGE-M3 finds; \`make demo\` runs the real model)"
fi
run search --collection "$COLLECTION" --model "$MODEL" --path "$STORE" --mode rerank --limit 3 \
    "How do I keep a sourdough starter alive?" \
    "Why rerank hybrid search results with ColBERT?" \
    "Wie kommt der Windstrom vom Norden in den Süden?"
echo
echo "== filtered (metadata lang=fr), RRF fusion of dense + sparse:"
run search "stockage des vecteurs" --collection "$COLLECTION" --model "$MODEL" --path "$STORE" \
    --mode hybrid --limit 3 --filter lang=fr

# The options a user must repeat, quoted for the shell: the collection and the store unless it is the
# default; search needs no --model (it uses the model the collection records), the server does.
STORE_OPT=""
[ "$STORE" != "./qdrant_data" ] && STORE_OPT=" --path $(printf '%q' "$STORE")"
SEARCH="bgem3-qdrant search \"how do I keep a sourdough starter alive?\" -c $(printf '%q' "$COLLECTION")$STORE_OPT"
echo
echo "== next, run these yourself from this folder:"
echo "  . .venv/bin/activate"
echo "  $SEARCH"
echo "  bgem3 serve --model $(printf '%q' "$MODEL")     # the model behind HTTP; in another terminal, through it:"
echo "  $SEARCH --encoder-url http://127.0.0.1:8000"

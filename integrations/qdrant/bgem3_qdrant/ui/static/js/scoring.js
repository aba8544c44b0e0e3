// Where a score the search shows and the explanation's score of the same mode can differ, and why. An
// explanation encodes the two texts again and scores them as FlagEmbedding's compute_score does (every token,
// no IDF); the search scores what the collection stores, as Qdrant scores it.

// scoring: the search answer's {colbert_pooling, sparse_modifier}. Returns [{key, mode, column, explanation}]:
// `column` is said under that mode's column of hits, `explanation` under an opened hit's scores.
export function scoreNotes(scoring) {
  const notes = [];
  const pooling = scoring ? Number(scoring.colbert_pooling) || 1 : 1;
  if (pooling > 1) {
    notes.push({
      key: "pooling",
      mode: "rerank",
      column:
        `Scores: Qdrant's MaxSim over the chunk's stored ColBERT rows, pooled by ${pooling} (--colbert-pooling). ` +
        "An opened hit's ColBERT score uses every token of the full text: it differs.",
      explanation:
        `ColBERT: the search's rerank score and its colbert stage come from the chunk's stored rows, pooled by ` +
        `${pooling} (--colbert-pooling ${pooling}); the ColBERT score above uses a vector for every token of ` +
        "the full text. The two differ.",
    });
  }
  if (scoring && scoring.sparse_modifier === "idf") {
    notes.push({
      key: "idf",
      mode: "sparse",
      column:
        "Scores: Qdrant's IDF-weighted dot product (--sparse-modifier idf), which also picks hybrid's sparse " +
        "candidates. An opened hit's sparse score is the reference's, without IDF: it differs.",
      explanation:
        "Sparse: the Sparse column scores and ranks with Qdrant's IDF-weighted dot product (--sparse-modifier " +
        "idf); the sparse score above, and the search's sparse stage score, are the reference lexical score, " +
        "without IDF.",
    });
  }
  return notes;
}

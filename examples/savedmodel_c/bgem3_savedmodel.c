/* BGE-M3 from TensorFlow's C API: load a `bgem3 export --format saved_model` folder, feed token ids, print
 * the three outputs as JSON. This is the API TensorFlow Java / Scala / Kotlin, Go, Rust and C# call.
 *
 *   ./bgem3_savedmodel out/bge-m3-savedmodel < ids.txt > outputs.json
 *
 * ids.txt: one text per line, its token ids separated by spaces, <s> and </s> included (the export's
 * tokenizer/tokenizer.json gives them). Texts are padded on the right with the pad id (1) and masked.
 * Output: {"dense_vecs": [[H floats] per text], "sparse_weights": [[L floats] per text],
 *          "colbert_vecs": [[[H floats] x (L - 1)] per text]}, L the longest text's length.
 * The tensor names are those of the export's `serving_default` signature (saved_model_cli show prints
 * them): outputs come out of StatefulPartitionedCall in the order of their sorted keys.
 * Build: examples/savedmodel_c/build.sh (gcc against the TensorFlow wheel's headers and libraries). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorflow/c/c_api.h"

#define PAD_ID 1

static const char *INPUT_IDS = "serving_default_input_ids";
static const char *ATTENTION_MASK = "serving_default_attention_mask";
static const char *OUTPUTS = "StatefulPartitionedCall";
/* Output index of each signature key: the keys sorted. */
enum { COLBERT = 0, DENSE = 1, SPARSE = 2, N_OUTPUTS = 3 };

static void die(const char *what, const char *detail) {
  fprintf(stderr, "error: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
  exit(1);
}

static void check(TF_Status *status, const char *what) {
  if (TF_GetCode(status) != TF_OK) die(what, TF_Message(status));
}

/* Reads one text's ids per line from stdin into a growing array; returns the number of texts. */
static int read_ids(int32_t ***rows, int64_t **lengths) {
  int n = 0, cap = 8;
  char *line = NULL;
  size_t line_cap = 0;
  *rows = malloc(cap * sizeof **rows);
  *lengths = malloc(cap * sizeof **lengths);
  while (getline(&line, &line_cap, stdin) > 0) {
    int64_t len = 0, row_cap = 64;
    int32_t *row = malloc(row_cap * sizeof *row);
    char *p = line, *end;
    for (long v = strtol(p, &end, 10); end != p; v = strtol(p, &end, 10)) {
      if (len == row_cap) row = realloc(row, (row_cap *= 2) * sizeof *row);
      row[len++] = (int32_t)v;
      p = end;
    }
    if (len == 0) { free(row); continue; }
    if (n == cap) {
      cap *= 2;
      *rows = realloc(*rows, cap * sizeof **rows);
      *lengths = realloc(*lengths, cap * sizeof **lengths);
    }
    (*rows)[n] = row;
    (*lengths)[n++] = len;
  }
  free(line);
  return n;
}

static void print_floats(const float *v, int64_t n) {
  putchar('[');
  for (int64_t i = 0; i < n; i++) printf("%s%.9g", i ? ", " : "", v[i]);
  putchar(']');
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s EXPORT_DIR < ids.txt   (one text's token ids per line)\n", argv[0]);
    return 2;
  }
  int32_t **rows;
  int64_t *lengths;
  int n = read_ids(&rows, &lengths);
  if (n == 0) die("no token ids on stdin", "one text per line, ids separated by spaces");
  int64_t len = 0;
  for (int i = 0; i < n; i++) len = lengths[i] > len ? lengths[i] : len;

  TF_Status *status = TF_NewStatus();
  TF_Graph *graph = TF_NewGraph();
  TF_SessionOptions *options = TF_NewSessionOptions();
  const char *tags[] = {"serve"};
  TF_Session *session =
      TF_LoadSessionFromSavedModel(options, NULL, argv[1], tags, 1, graph, NULL, status);
  check(status, "cannot load the SavedModel");

  int64_t dims[2] = {n, len};
  TF_Tensor *ids = TF_AllocateTensor(TF_INT32, dims, 2, (size_t)(n * len) * sizeof(int32_t));
  TF_Tensor *mask = TF_AllocateTensor(TF_INT32, dims, 2, (size_t)(n * len) * sizeof(int32_t));
  int32_t *id_data = TF_TensorData(ids), *mask_data = TF_TensorData(mask);
  for (int i = 0; i < n; i++)
    for (int64_t j = 0; j < len; j++) {
      int real = j < lengths[i];
      id_data[i * len + j] = real ? rows[i][j] : PAD_ID;
      mask_data[i * len + j] = real;
    }

  TF_Operation *in_ids = TF_GraphOperationByName(graph, INPUT_IDS);
  TF_Operation *in_mask = TF_GraphOperationByName(graph, ATTENTION_MASK);
  TF_Operation *out = TF_GraphOperationByName(graph, OUTPUTS);
  if (!in_ids || !in_mask || !out) die("not a bgem3 export", "serving_default tensors not found");
  TF_Output inputs[2] = {{in_ids, 0}, {in_mask, 0}};
  TF_Tensor *input_values[2] = {ids, mask};
  TF_Output outputs[N_OUTPUTS] = {{out, COLBERT}, {out, DENSE}, {out, SPARSE}};
  TF_Tensor *values[N_OUTPUTS] = {NULL};
  TF_SessionRun(session, NULL, inputs, input_values, 2, outputs, values, N_OUTPUTS, NULL, 0, NULL,
                status);
  check(status, "the model did not run");

  /* The shapes say which output is which: dense [n, H], sparse [n, len], colbert [n, len - 1, H]. */
  int64_t hidden = TF_Dim(values[DENSE], 1);
  if (TF_NumDims(values[DENSE]) != 2 || TF_NumDims(values[SPARSE]) != 2 ||
      TF_Dim(values[SPARSE], 1) != len || TF_NumDims(values[COLBERT]) != 3 ||
      TF_Dim(values[COLBERT], 1) != len - 1 || TF_Dim(values[COLBERT], 2) != hidden)
    die("unexpected output shapes", "is this a bgem3 export?");
  const float *dense = TF_TensorData(values[DENSE]);
  const float *sparse = TF_TensorData(values[SPARSE]);
  const float *colbert = TF_TensorData(values[COLBERT]);

  printf("{\"dense_vecs\": [");
  for (int i = 0; i < n; i++) { if (i) printf(", "); print_floats(dense + i * hidden, hidden); }
  printf("],\n \"sparse_weights\": [");
  for (int i = 0; i < n; i++) { if (i) printf(", "); print_floats(sparse + i * len, len); }
  printf("],\n \"colbert_vecs\": [");
  for (int i = 0; i < n; i++) {
    printf("%s[", i ? ", " : "");
    for (int64_t t = 0; t < len - 1; t++) {
      if (t) printf(", ");
      print_floats(colbert + (i * (len - 1) + t) * hidden, hidden);
    }
    putchar(']');
  }
  printf("]}\n");

  for (int k = 0; k < N_OUTPUTS; k++) TF_DeleteTensor(values[k]);
  TF_DeleteTensor(ids);
  TF_DeleteTensor(mask);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteStatus(status);
  for (int i = 0; i < n; i++) free(rows[i]);
  free(rows);
  free(lengths);
  return 0;
}

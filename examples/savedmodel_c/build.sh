#!/usr/bin/env bash
# Build bgem3_savedmodel with the system C compiler against the TensorFlow wheel this Python has installed:
# its headers (tensorflow/include) and its C API libraries (libtensorflow_cc.so.2 holds TF_SessionRun and
# TF_LoadSessionFromSavedModel, libtensorflow_framework.so.2 the tensor and status functions).
#   examples/savedmodel_c/build.sh [OUT]      PYTHON=... to name another interpreter (default: python3)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/bgem3_savedmodel}"
tf="$("${PYTHON:-python3}" -c 'import os, importlib.util as u; print(os.path.dirname(u.find_spec("tensorflow").origin))')"
"${CC:-gcc}" -O2 -Wall -Wextra -std=c11 -D_POSIX_C_SOURCE=200809L -I"$tf/include" "$here/bgem3_savedmodel.c" \
  -o "$out" -L"$tf" -l:libtensorflow_cc.so.2 -l:libtensorflow_framework.so.2 -Wl,-rpath,"$tf"
echo "$out"

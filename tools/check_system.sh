#!/bin/sh
# What `make test` needs from the system, checked before anything is installed (a fresh `make test` spends
# minutes and GBs on the venv first): each missing piece is one line with the command that installs it on
# Debian/Ubuntu (apt) and on macOS (Homebrew). Exit 1 when anything is missing.
#   PYTHON  the interpreter the venv is made from (default python3)
PYTHON="${PYTHON:-python3}"
missing=0

need() {  # need WHAT APT BREW
    echo "error: make test needs $1: Debian/Ubuntu: sudo apt-get install -y $2; macOS: brew install $3" >&2
    missing=1
}

if ! command -v "$PYTHON" >/dev/null 2>&1 \
    || ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
    need "Python >= 3.11 as $PYTHON (Keras 3.15 needs it; PYTHON=... names another)" \
        "python3 python3-venv" "python@3.12"
elif ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    need "Python's venv module with ensurepip for $PYTHON" "python3-venv" "python@3.12"
fi
# The page's browser tests (bgem3-qdrant ui) drive a headless Chromium through its chromedriver.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    need "chromium (the page's browser tests)" "chromium" "--cask chromium"
fi
if ! command -v chromedriver >/dev/null 2>&1; then
    need "chromedriver (the page's browser tests)" "chromium-driver" "--cask chromedriver"
fi
exit "$missing"

"""`bgem3-qdrant ui`: a local page to search a store in every mode and see why each hit came back.

- `errors`: PageError and the HTTP status of every expected failure (one line each).
- `session`: the store (opened lazily, retried), the encoder, searches in all four modes, explanations.
- `highlight`: a hit's matched sparse terms from its stored sparse vector (no encoding).
- `evals`: the `bgem3-qdrant eval --json` files of --eval-dir, checked and shaped for the charts.
- `app`: the Starlette app: static page, JSON API, Content-Security-Policy, optional API key.
- `command`: what the `ui` command runs (bind, load the encoder, print the address, serve).
- `static/`: the page itself (HTML, CSS, ES modules; no build step, nothing fetched from elsewhere).
"""

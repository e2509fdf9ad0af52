#!/usr/bin/env bash
# The Python references of the tests: a virtual environment over Debian's python3 (so it sees
# Debian's python3-torch 1.13) with Hugging Face tokenizers and transformers and sentencepiece
# from PyPI, pinned (transformers 4.46 is the newest that runs on torch 1.13; its converter of
# SentencePiece models to tokenizer.json reads them with sentencepiece's protobuf code, which
# needs protobuf of the major version it was generated with), and Jinja2, which transformers
# renders chat templates with (apply_chat_template). Nothing goes into
# the system Python. Idempotent; prints the environment's python.
#   DTRAIN_PYTHON_ENV  where the environment lives (default ~/.cache/dtrain/python-env)
set -euo pipefail
env_dir=${DTRAIN_PYTHON_ENV:-$HOME/.cache/dtrain/python-env}
requirements=(tokenizers==0.20.3 sentencepiece==0.2.3 transformers==4.46.3 protobuf==7.36.1
  jinja2==3.1.4)
python=$env_dir/bin/python
if ! "$python" -c 'import tokenizers, sentencepiece, transformers, google.protobuf, jinja2' \
  2>/dev/null; then
  /usr/bin/python3 -m venv --system-site-packages "$env_dir" >&2
  "$python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}" >&2
fi
echo "$python"

#!/usr/bin/env bash
# Supervised fine-tuning end to end on this CPU, nothing downloaded (README.md, "SFT end to
# end"): a tokenizer trained by Hugging Face tokenizers, a small Llama pretrained by dtrain and
# saved again by transformers (the Hugging Face weights to start from), chat data from the
# fortunes' attributed quotes, `dtrain data pack --sft`, configs/sft-llama-tiny.yaml, and the
# fine-tuned folder answering questions in transformers. Outputs go to runs/sft-demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
python=$(bash scripts/python_env.sh)
bash scripts/build.sh
bash scripts/prepare_demo_data.sh
exec "$python" tests/reference/sft_chain.py --dtrain build/dtrain --out runs/sft-demo "$@"

# shellcheck shell=bash
# The GPU benchmark's shapes as `--set` overrides of configs/tiny.yaml, sourced by
# scripts/gpu/bench.sh and scripts/gpu/profile.sh: GPT-2 124M (B 16, T 1024) and a Llama ~1B shape
# (16 layers, d_model 2048, 32 query and 8 kv heads, d_ff 8192, B 8, T 1024).
# shellcheck disable=SC2034  # used by the scripts that source this
gpt2_124m=(model.family=gpt2 model.n_layer=12 model.n_head=12 model.d_model=768 model.d_ff=0
           model.vocab_size=50257 model.max_seq_len=1024 train.seq_len=1024 train.batch_size=16
           train.micro_batch=16)
llama_1b=(model.family=llama model.n_layer=16 model.n_head=32 model.n_kv_head=8 model.d_model=2048
          model.d_ff=8192 model.vocab_size=32000 model.max_seq_len=1024 train.seq_len=1024
          train.batch_size=8 train.micro_batch=8)

# set_flags KEY=VALUE...: prints each as `--set KEY=VALUE`, one word a line.
set_flags() {
  local assignment
  for assignment in "$@"; do printf -- '--set\n%s\n' "$assignment"; done
}

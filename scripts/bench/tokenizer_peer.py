"""The Hugging Face tokenizers side of tokenizer_throughput.sh.

    python tokenizer_peer.py train TEXT OUT_DIR VOCAB   trains the byte-level references
    python tokenizer_peer.py encode TOKENIZER_JSON TEXT
        prints "tokens=N seconds=S": encode_batch() of the text's lines, on the threads the
        caller gives rayon (RAYON_NUM_THREADS). That is the library's fast path: encode() of a
        whole 10 MB text ran at 0.3 MB/s here (it tracks offsets for every byte). The file is
        read before the clock starts.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "reference"))


def main():
    if sys.argv[1] == "train":
        import reference_tokenizers
        text = open(sys.argv[2], encoding="utf-8", errors="replace").read()
        reference_tokenizers.train_all(text, sys.argv[3], vocab_size=int(sys.argv[4]),
                                       sentencepiece_model=False)
        return
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(sys.argv[2])
    text = open(sys.argv[3], encoding="utf-8").read()
    lines = text.splitlines(keepends=True)
    start = time.perf_counter()
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(lines, add_special_tokens=False))
    print(f"tokens={tokens} seconds={time.perf_counter() - start:.4f}")


if __name__ == "__main__":
    main()

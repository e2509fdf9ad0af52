"""dtrain's tokenizers against the reference implementations, token for token.

    $DTRAIN_REFERENCE_PYTHON tests/reference/test_tokenizer_parity.py --dtrain build/dtrain

Trains seven tokenizers on the demo text with the references' own trainers and converters
(reference_tokenizers.py), then for each case of a varied corpus (English, CJK, emoji,
combining marks, right-to-left scripts, whitespace runs, digits, code, very long words,
repeated characters, special tokens in the text) compares `dtrain data encode` with:
- Hugging Face tokenizers' encode(text, add_special_tokens=False) for the tokenizer.json files
  (byte-level: gpt2, llama3; SentencePiece-style: llama2, llama2_metaspace, sentencepiece_bpe);
- transformers' GPT2Tokenizer (the original Python implementation) for encoder.json/vocab.bpe;
- sentencepiece's encode for the .model, each stretch between special pieces (<s>, </s>,
  <unk>) encoded on its own, as dtrain does.
`dtrain data decode` must give the text back (byte-level: exactly, invalid UTF-8 included;
the others: what the reference's decode gives). Invalid UTF-8 must encode where every byte has
a token (byte-level BPE, byte fallback) and decode back exactly, and be a clear error (exit 1,
naming the byte offset) elsewhere (SentencePiece, sentencepiece_bpe). A megabyte of the demo
text is also encoded with --threads 2, which must give the ids of one thread.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_tokenizers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CORPUS = {
    "english": "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see, "
               "won't we? YOU'RE RIGHT, I'M SURE -- they'd've known.\n",
    "cjk": "日本語のテキストと中文字符，还有한국어 문장도 있습니다。東京タワー",
    "emoji": "Party 🎉🎉 family 👩‍👩‍👧‍👦 flags 🇺🇸🇯🇵 skin 👍🏽 and ☃️ snow",
    "combining": "e\u0301 a\u0308 n\u0303 Z\u0324\u0354\u0367\u0311\u0313 "
                 "\u1100\u1161\u11a8 q\u0307\u0323",
    "right_to_left": "مرحبا بالعالم! שלום עולם, ‏123‏ and العربية mixed",
    "whitespace": "a   b\t\t c\n\n\n  d \u00a0 \u3000x   \n \t\r\n  end   ",
    "leading_space": "   leading and trailing   ",
    "digits": "1234567890 3.14159 1,000,000 007 12345678901234567890 ٣٤٥ ⅫⅣ",
    "code": "def f(x):\n    return {'a': [x ** 2 for x in range(10)]}  # comment\n\n"
            "int main() { printf(\"%d\\n\", a[i++] << 3); }\n\t\tif (a && b || !c) {}\n",
    "long_word": "supercalifragilistic" * 300,
    "repeated_a": "a" * 5000,
    "repeated_pair": "ab" * 3000,
    "space_run": " " * 3000 + "x",
    "newline_run": "\n" * 700 + "y\n\n",
    "punctuation_run": "!?" * 1500,
    "mixed_scripts": "Ελληνικά Русский हिन्दी ไทย 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0001F600\U0010FFFD",
    "control_chars": "tab\there\x00nul\x07bell\x1bescape\x7fdel\u0085nel\u2028ls",
}
SPECIAL_TEXT = {
    "gpt2": "<|endoftext|>Hello<|endoftext|> world <|endoftext|",
    "gpt2_files": "<|endoftext|>Hello<|endoftext|> world <|endoftext|",
    "llama3": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|eot_id",
    "sentencepiece": "<s>Hello</s> world <s> again <unk> </s",
}
for _name in ("llama2", "llama2_metaspace", "sentencepiece_bpe"):
    SPECIAL_TEXT[_name] = SPECIAL_TEXT["sentencepiece"]
SPECIAL_TEXT["qwen2"] = "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>e\u0301<|im_end"
HF_JSON = ("gpt2", "llama3", "llama2", "llama2_metaspace", "sentencepiece_bpe", "qwen2")
# Byte-level without a normalizer: decode gives back the text's own bytes.
BYTE_LEVEL = ("gpt2", "llama3", "gpt2_files")
# Every byte has a token: invalid UTF-8 encodes and decodes back exactly.
ANY_BYTES = BYTE_LEVEL + ("llama2", "llama2_metaspace", "qwen2")
INVALID_UTF8 = b"abc\xff\xfe def \xc3( caf\xc3\xa9 \xe2\x82 end\x80"


class Checker:
    def __init__(self, dtrain, workdir):
        self.dtrain = dtrain
        self.workdir = workdir
        self.failures = []
        self.count = 0

    def run(self, args):
        return subprocess.run([self.dtrain, "data"] + args, capture_output=True)

    def write(self, name, data):
        path = os.path.join(self.workdir, name)
        with open(path, "wb") as out:
            out.write(data)
        return path

    def encode(self, tokenizer, data, threads=1):
        path = self.write("case.txt", data)
        done = self.run(["encode", "--tokenizer", tokenizer, "--threads", str(threads), path])
        if done.returncode != 0:
            return None, done.stderr.decode(errors="replace")
        return json.loads(done.stdout), ""

    def decode(self, tokenizer, ids):
        path = self.write("ids.json", json.dumps(ids).encode())
        done = self.run(["decode", "--tokenizer", tokenizer, path])
        return done.stdout if done.returncode == 0 else None

    def expect(self, ok, what):
        self.count += 1
        if not ok:
            self.failures.append(what)
            print("FAIL", what, flush=True)


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at token {i}: dtrain {a[i:i + 6]} vs reference {b[i:i + 6]}"
    return f"lengths {len(a)} (dtrain) vs {len(b)} (reference)"


def references(folders):
    from tokenizers import Tokenizer
    from transformers import GPT2Tokenizer
    import sentencepiece

    hf = {name: Tokenizer.from_file(os.path.join(folders[name], "tokenizer.json"))
          for name in HF_JSON}
    gpt2_slow = GPT2Tokenizer(os.path.join(folders["gpt2_files"], "encoder.json"),
                              os.path.join(folders["gpt2_files"], "vocab.bpe"))
    sp = sentencepiece.SentencePieceProcessor(
        model_file=os.path.join(folders["sentencepiece"], "tokenizer.model"))
    sp_specials = sorted({sp.id_to_piece(i) for i in range(sp.get_piece_size())
                          if sp.is_control(i) or sp.is_unknown(i)}, key=len, reverse=True)

    def sp_encode(text):
        ids, plain = [], ""
        i = 0
        while i < len(text):
            special = next((s for s in sp_specials if text.startswith(s, i)), None)
            if special is None:
                plain += text[i]
                i += 1
                continue
            if plain:
                ids += sp.encode(plain)
            plain = ""
            ids.append(sp.piece_to_id(special))
            i += len(special)
        if plain:
            ids += sp.encode(plain)
        return ids

    def hf_pair(name):
        return (lambda t: hf[name].encode(t, add_special_tokens=False).ids,
                lambda ids: hf[name].decode(ids, skip_special_tokens=False))

    return {
        **{name: hf_pair(name) for name in HF_JSON},
        "gpt2_files": (lambda t: gpt2_slow.encode(t, add_special_tokens=False),
                       lambda ids: gpt2_slow.decode(ids)),
        "sentencepiece": (sp_encode, lambda ids: sp.decode(ids)),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtrain", required=True)
    args = parser.parse_args()
    fortunes = os.path.join(ROOT, "data", "fortunes.txt")
    if not os.path.exists(fortunes):
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "prepare_demo_data.sh")], check=True)
    text = open(fortunes, encoding="utf-8", errors="replace").read()
    with tempfile.TemporaryDirectory() as workdir:
        folders = reference_tokenizers.train_all(text, os.path.join(workdir, "tokenizers"))
        refs = references(folders)
        check = Checker(args.dtrain, workdir)
        for name, (encode, decode) in refs.items():
            byte_level = name in BYTE_LEVEL
            cases = dict(CORPUS, special_tokens=SPECIAL_TEXT[name], demo=text[:20000])
            for case, case_text in cases.items():
                expected = encode(case_text)
                ids, error = check.encode(folders[name], case_text.encode())
                check.expect(ids == expected, f"{name}/{case}: " + (
                    error or (first_difference(ids, expected) if ids != expected else "")))
                if ids is None:
                    continue
                decoded = check.decode(folders[name], ids)
                want = case_text.encode() if byte_level else decode(ids).encode()
                check.expect(decoded == want, f"{name}/{case}: decode does not round-trip")
            ids, error = check.encode(folders[name], INVALID_UTF8)
            if name in ANY_BYTES:
                check.expect(ids is not None and check.decode(folders[name], ids) == INVALID_UTF8,
                             f"{name}/invalid_utf8: does not encode and round-trip: {error}")
            else:
                check.expect(ids is None and "not valid UTF-8" in error and "byte offset 3" in error,
                             f"{name}/invalid_utf8: not a clear error: {error!r}")
        # The parallel split (bpe.h) gives the ids of one thread.
        demo = text[:1_500_000]
        for name in HF_JSON:
            ids, error = check.encode(folders[name], demo.encode(), threads=2)
            expected = refs[name][0](demo)
            check.expect(ids == expected, f"{name}/demo, 2 threads: " + (
                error or (first_difference(ids, expected) if ids != expected else "")))
        # Every form of naming a tokenizer: the file itself, and either file of GPT-2's pair.
        for path in (os.path.join(folders["gpt2"], "tokenizer.json"),
                     os.path.join(folders["gpt2_files"], "vocab.bpe"),
                     os.path.join(folders["sentencepiece"], "tokenizer.model"),
                     os.path.join(folders["llama2"], "tokenizer.json")):
            ids, error = check.encode(path, b"Hello world")
            check.expect(ids is not None, f"{path}: {error}")
    print(f"{check.count - len(check.failures)} of {check.count} checks passed")
    sys.exit(1 if check.failures else 0)


if __name__ == "__main__":
    main()

"""Reference tokenizers trained by their own libraries' trainers on the demo text.

    train_all(text, out_dir) -> {"gpt2": DIR, "llama3": DIR, "gpt2_files": DIR, "sentencepiece": DIR,
                                 "llama2": DIR, "llama2_metaspace": DIR, "sentencepiece_bpe": DIR,
                                 "qwen2": DIR}

- gpt2: a Hugging Face tokenizer.json, byte-level BPE as GPT-2's (ByteLevel pre-tokenizer with
  its built-in regex, <|endoftext|> special);
- llama3: a tokenizer.json as Llama 3's (its split regex, then ByteLevel without a regex,
  ignore_merges, <|begin_of_text|>, <|eot_id|> and the other special tokens);
- gpt2_files: gpt2's vocabulary and merges as GPT-2's original encoder.json + vocab.bpe;
- sentencepiece: a tokenizer.model as Llama 2's (BPE, byte_fallback, split_digits, identity
  normalization), by the sentencepiece trainer;
- llama2: that model as transformers' converter writes Llama 2's tokenizer.json (Prepend and
  Replace normalizers, BPE with byte_fallback, the Replace/ByteFallback/Fuse/Strip decoder);
- llama2_metaspace: the same, converted with legacy=False (no normalizer; a Metaspace
  pre-tokenizer with prepend_scheme "first" and no split);
- sentencepiece_bpe: tokenizers' SentencePieceBPETokenizer trained by its own trainer (NFKC,
  Metaspace with prepend_scheme "always" and split, <unk> without byte fallback);
- qwen2: a tokenizer.json as Qwen2's (an NFC normalizer before its split regex and ByteLevel
  without a regex, <|endoftext|>, <|im_start|>, <|im_end|>).
The ones after gpt2_files are trained only with sentencepiece_model.
"""
import json
import os

import sentencepiece
from tokenizers import (Regex, SentencePieceBPETokenizer, Tokenizer, decoders, models,
                        normalizers, pre_tokenizers, trainers)
from transformers import LlamaTokenizerFast

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|finetune_right_pad_id|>"]


def _byte_level(model, pre_tokenizer, vocab_size, specials, lines, path, normalizer=None):
    tokenizer = Tokenizer(model)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(lines, trainer)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tokenizer.save(path)
    return tokenizer


def _gpt2_files(tokenizer_json, folder):
    """GPT-2's own file pair from a byte-level tokenizer.json: same vocabulary, same merges."""
    model = json.load(open(tokenizer_json, encoding="utf-8"))["model"]
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "encoder.json"), "w", encoding="utf-8") as out:
        json.dump(model["vocab"], out, ensure_ascii=False)
    with open(os.path.join(folder, "vocab.bpe"), "w", encoding="utf-8") as out:
        out.write("#version: 0.2\n")
        for merge in model["merges"]:
            out.write((merge if isinstance(merge, str) else " ".join(merge)) + "\n")


def train_all(text, out_dir, vocab_size=4000, sentencepiece_lines=20000, sentencepiece_model=True):
    lines = text.splitlines(keepends=True)
    folders = {name: os.path.join(out_dir, name)
               for name in ("gpt2", "llama3", "gpt2_files", "sentencepiece", "llama2",
                            "llama2_metaspace", "sentencepiece_bpe", "qwen2")}
    _byte_level(models.BPE(), pre_tokenizers.ByteLevel(add_prefix_space=False), vocab_size,
                ["<|endoftext|>"], lines, os.path.join(folders["gpt2"], "tokenizer.json"))
    _byte_level(
        models.BPE(ignore_merges=True),
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        vocab_size, LLAMA3_SPECIALS, lines, os.path.join(folders["llama3"], "tokenizer.json"))
    _gpt2_files(os.path.join(folders["gpt2"], "tokenizer.json"), folders["gpt2_files"])
    if not sentencepiece_model:
        return folders
    os.makedirs(folders["sentencepiece"], exist_ok=True)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([line.rstrip("\n") for line in lines if line.strip()]
                               [:sentencepiece_lines]),
        model_prefix=os.path.join(folders["sentencepiece"], "tokenizer"),
        vocab_size=vocab_size // 2, model_type="bpe", byte_fallback=True, split_digits=True,
        allow_whitespace_only_pieces=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, character_coverage=0.9995, minloglevel=2)
    model_file = os.path.join(folders["sentencepiece"], "tokenizer.model")
    for name, legacy in (("llama2", True), ("llama2_metaspace", False)):
        # add_prefix_space=True: Llama 2's own tokenizer.json prepends "▁" (with None, 4.46's
        # converter leaves the Prepend out).
        LlamaTokenizerFast(vocab_file=model_file, from_slow=True, legacy=legacy,
                           add_prefix_space=True).save_pretrained(folders[name])
    sentencepiece_bpe = SentencePieceBPETokenizer()
    sentencepiece_bpe.train_from_iterator(lines, vocab_size=vocab_size // 2,
                                          special_tokens=["<unk>", "<s>", "</s>"],
                                          show_progress=False)
    os.makedirs(folders["sentencepiece_bpe"], exist_ok=True)
    sentencepiece_bpe.save(os.path.join(folders["sentencepiece_bpe"], "tokenizer.json"))
    _byte_level(
        models.BPE(),
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        vocab_size, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], lines,
        os.path.join(folders["qwen2"], "tokenizer.json"), normalizer=normalizers.NFC())
    return folders

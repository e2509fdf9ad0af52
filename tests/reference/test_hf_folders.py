"""Hugging Face model folders against transformers itself, in both directions.

    $DTRAIN_REFERENCE_PYTHON tests/reference/test_hf_folders.py --dtrain build/dtrain

Run by the reference environment's python (scripts/python_env.sh: transformers 4.46.3 over
Debian's torch 1.13); nothing is downloaded: models and tokenizers are made here.

- export: for a small GPT-2 and Llama, `dtrain train` on bytes ends in train.export_to=<folder>,
  whose byte-level tokenizer AutoTokenizer encodes as the text's bytes, and
  `dtrain ckpt export --format hf --tokenizer ...` exports its checkpoint; AutoModelForCausalLM
  loads each folder and its logits on a token batch equal parity_probe's (dtrain's forward, on
  the same folder) within TOLERANCE. AutoTokenizer loads each exported tokenizer, made here by
  the references' own trainers (a byte-level BPE tokenizer.json, the same as GPT-2's
  encoder.json + vocab.bpe, a SentencePiece model and its conversion to Llama 2's
  tokenizer.json), and encodes as the trainer's tokenizer does.
- import: a folder that transformers' save_pretrained writes from a random-initialised config
  (whole, in shards with model.safetensors.index.json, and a Llama with tied embeddings) trains in dtrain (parity_probe, from
  the folder): the step-0 loss equals transformers' loss on the same batch within TOLERANCE and
  the loss falls over the steps; `dtrain train` starts from it (train.init_from) and refuses it
  when the recipe's model disagrees with config.json, naming the field.

Metric for logits: max |dtrain - transformers| / max |transformers| (float32 both sides, the
same metric and bound as test_torch_parity.py); for the loss, the absolute difference.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

TOLERANCE = 1e-4
TIMEOUT_S = 300
SEQ_LEN = 16
BATCH = 4
TEXT = "".join(f"The quick brown fox {i} jumps over the lazy dog; naïve café 北京 {i * 7}.\n"
               for i in range(300))

# GPT-2's vocabulary holds the byte-level BPE of make_tokenizers (320 ids) that its folders carry.
MODELS = {
    "gpt2": {"family": "gpt2", "n_layer": 2, "n_head": 4, "d_model": 32, "d_ff": 128,
             "vocab_size": 320, "max_seq_len": 32, "norm_eps": 1e-5},
    "llama": {"family": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 32,
              "d_ff": 64, "vocab_size": 256, "max_seq_len": 32, "norm_eps": 1e-5,
              "rope_theta": 10000.0},
}


def run(command):
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def recipe(folder, model, steps, extra_train=None):
    """A recipe file for `model` on the byte text TEXT; returns its path."""
    text_path = os.path.join(folder, "text.txt")
    with open(text_path, "w") as f:
        f.write(TEXT)
    train = {"steps": steps, "batch_size": BATCH, "micro_batch": BATCH, "seq_len": SEQ_LEN,
             "lr": 3e-3, "min_lr": 3e-3, "warmup_steps": 0, "schedule": "constant",
             "eval_every": 0, "export_to": "", **(extra_train or {})}
    sections = {"run": {"name": "run", "out_dir": folder, "threads": 1},
                "model": model, "data": {"train": [text_path]}, "train": train,
                "logging": {"sample_tokens": 0}}
    path = os.path.join(folder, f"recipe-{steps}.yaml")
    with open(path, "w") as f:
        for section, keys in sections.items():
            f.write(f"{section}:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in keys.items()))
    return path


def batches(steps, vocab_size, seed):
    """int64 (steps, BATCH, SEQ_LEN + 1): one random batch, repeated every step."""
    generator = torch.Generator().manual_seed(seed)
    batch = torch.randint(0, vocab_size, (BATCH, SEQ_LEN + 1), generator=generator)
    return batch.unsqueeze(0).repeat(steps, 1, 1)


def probe(probe_path, folder, recipe_path, weights, tokens):
    """parity_probe's outputs: logits of tokens[0] and the loss of every step."""
    batch_path = os.path.join(folder, "batch.safetensors")
    out_path = os.path.join(folder, "probe.safetensors")
    safetensors_io.save(batch_path, {"tokens": tokens.to(torch.int32)})
    run([probe_path, "--recipe", recipe_path, "--weights", weights, "--batch", batch_path,
         "--out", out_path])
    return safetensors_io.load(out_path)


def hf_logits(folder, tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(tokens[0, :, :SEQ_LEN]).logits


def relative(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


# ---------------------------------------------------------------------------------------------
# Tokenizers, made by the references' own trainers


def make_tokenizers(folder):
    """{kind: path to pass to --tokenizer} and {kind: the reference's ids of TEXT's first line}."""
    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    lines = TEXT.splitlines()
    sample = lines[3]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast_dir = os.path.join(folder, "tok-fast")
    os.makedirs(fast_dir)
    bpe.save(os.path.join(fast_dir, "tokenizer.json"))
    # GPT-2's original file names for the same vocabulary and merges.
    openai_dir = os.path.join(folder, "tok-openai")
    os.makedirs(openai_dir)
    bpe.model.save(openai_dir)
    os.rename(os.path.join(openai_dir, "vocab.json"), os.path.join(openai_dir, "encoder.json"))
    os.rename(os.path.join(openai_dir, "merges.txt"), os.path.join(openai_dir, "vocab.bpe"))
    with open(os.path.join(openai_dir, "encoder.json")) as f:
        encoder = json.load(f)
    encoder["<|endoftext|>"] = bpe.token_to_id("<|endoftext|>")
    with open(os.path.join(openai_dir, "encoder.json"), "w") as f:
        json.dump(encoder, f)

    spm_prefix = os.path.join(folder, "tok-spm")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=spm_prefix,
                                   vocab_size=200, model_type="bpe", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=spm_prefix + ".model")
    # Without the dummy prefix ("a" is not "▁a"), which the fast tokenizer transformers builds
    # from tokenizer.model alone adds anyway; Llama's identity normalizer.
    no_prefix = os.path.join(folder, "tok-spm-no-prefix")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=no_prefix,
                                   vocab_size=200, model_type="bpe", minloglevel=2,
                                   add_dummy_prefix=False, normalization_rule_name="identity")
    sp_no_prefix = spm.SentencePieceProcessor(model_file=no_prefix + ".model")
    # The same model as Llama 2's tokenizer.json (transformers' converter), alone in its folder:
    # dtrain writes the tokenizer_config.json that names its <s>, </s> and <unk>.
    llama2_dir = os.path.join(folder, "tok-llama2")
    llama2_fast = transformers.LlamaTokenizerFast(vocab_file=spm_prefix + ".model", from_slow=True,
                                                  add_prefix_space=True)
    llama2_fast.save_pretrained(llama2_dir)
    # And the folder as transformers saved it: its tokenizer_config.json (add_prefix_space) makes
    # AutoTokenizer rebuild the fast tokenizer from tokenizer.model, which the export must carry.
    saved_dir = os.path.join(folder, "tok-llama2-saved")
    llama2_fast.save_pretrained(saved_dir)
    for name in os.listdir(llama2_dir):
        if name != "tokenizer.json":
            os.remove(os.path.join(llama2_dir, name))
    llama2 = Tokenizer.from_file(os.path.join(llama2_dir, "tokenizer.json"))
    paths = {"tokenizer.json": fast_dir,
             "encoder.json + vocab.bpe": os.path.join(openai_dir, "vocab.bpe"),
             "tokenizer.model": spm_prefix + ".model",
             "no-dummy-prefix tokenizer.model": no_prefix + ".model",
             "Llama 2 tokenizer.json": llama2_dir,
             "saved Llama 2 folder": saved_dir}
    ids = {"tokenizer.json": bpe.encode(sample).ids,
           "encoder.json + vocab.bpe": bpe.encode(sample).ids,
           "tokenizer.model": [sp.bos_id()] + sp.encode(sample),
           "no-dummy-prefix tokenizer.model": [sp_no_prefix.bos_id()] + sp_no_prefix.encode(sample),
           # Its post-processor adds <s>, as LlamaTokenizer does.
           "Llama 2 tokenizer.json": llama2.encode(sample).ids,
           "saved Llama 2 folder": llama2.encode(sample).ids}
    # What config.json's bos_token_id and eos_token_id must say.
    special = {"tokenizer.model": (sp.bos_id(), sp.eos_id()),
               "no-dummy-prefix tokenizer.model": (sp_no_prefix.bos_id(), sp_no_prefix.eos_id())}
    return paths, ids, sample, special


# ---------------------------------------------------------------------------------------------
# The checks


def check_export(dtrain, probe_path, root):
    """dtrain's folders (end-of-run and ckpt export) load in transformers with dtrain's logits
    and their tokenizers in AutoTokenizer."""
    results = []
    tokenizer_paths, reference_ids, sample, special_ids = make_tokenizers(root)
    exports = {"gpt2": ["tokenizer.json", "encoder.json + vocab.bpe"],
               "llama": ["tokenizer.model", "no-dummy-prefix tokenizer.model",
                         "Llama 2 tokenizer.json", "saved Llama 2 folder"]}
    # The fast tokenizer transformers builds from tokenizer.model alone ignores tok-spm's
    # normalizer (sentencepiece's default nmt_nfkc) and the other model's lack of a dummy prefix:
    # the export warns.
    warnings = {"tokenizer.model": "normalizes text",
                "no-dummy-prefix tokenizer.model": "adds no word boundary before a text"}
    for name, model in MODELS.items():
        folder = os.path.join(root, f"export-{name}")
        os.makedirs(folder)
        run([dtrain, "train", recipe(folder, model, 2, {"export_to": "hf-model"})])
        end_of_run = os.path.join(folder, "run", "hf-model")
        tokens = batches(1, model["vocab_size"], seed=3)
        got = probe(probe_path, folder, recipe(folder, model, 1), end_of_run, tokens)["logits"]
        err = relative(got, hf_logits(end_of_run, tokens))
        results.append((err <= TOLERANCE, f"export.{name}.end_of_run logits {err:.1e}"))
        # The run trained on bytes, so its folder's tokenizer is one token per byte.
        byte_tokenizer = transformers.AutoTokenizer.from_pretrained(end_of_run)
        text = TEXT[:200] + " \t\n  x"
        byte_ids = byte_tokenizer(text)["input_ids"]
        back = byte_tokenizer.decode(byte_ids)
        results.append((byte_ids == list(text.encode()) and back == text,
                        f"export.{name}.end_of_run {type(byte_tokenizer).__name__} ids "
                        f"{'are the bytes' if byte_ids == list(text.encode()) else byte_ids[:20]}, "
                        f"decode {'equal' if back == text else repr(back[:40])}"))
        for kind in exports[name]:
            out = os.path.join(folder, "ckpt-export-" + kind.split()[0])
            exported = run([dtrain, "ckpt", "export", os.path.join(folder, "run", "checkpoints"),
                            "--format", "hf", "--out", out, "--tokenizer", tokenizer_paths[kind]])
            warned = [w for w in warnings.values() if w in exported.stderr]
            expected = [warnings[kind]] if kind in warnings else []
            err = relative(got, hf_logits(out, tokens))
            # The slow LlamaTokenizer: the fast one's conversion needs protobuf, not installed.
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                out, use_fast=not kind.endswith("tokenizer.model"))
            ids = tokenizer(sample)["input_ids"]
            with open(os.path.join(out, "config.json")) as f:
                config = json.load(f)
            stops = (config.get("bos_token_id"), config.get("eos_token_id"))
            stops_ok = kind not in special_ids or stops == special_ids[kind]
            ok = (err <= TOLERANCE and ids == reference_ids[kind] and warned == expected
                  and stops_ok)
            results.append((ok, f"export.{name}.ckpt_export ({kind}) logits {err:.1e}, "
                                f"{type(tokenizer).__name__} ids {'equal' if ids == reference_ids[kind] else ids}, "
                                f"fast-tokenizer warning {warned or 'none'}, "
                                f"bos/eos ids {stops}"))
    return results


def save_pretrained(name, model, folder, shard, tied=False):
    if name == "gpt2":
        config = transformers.GPT2Config(
            n_layer=model["n_layer"], n_head=model["n_head"], n_embd=model["d_model"],
            n_inner=None, vocab_size=model["vocab_size"], n_positions=model["max_seq_len"],
            layer_norm_epsilon=model["norm_eps"])
    else:
        config = transformers.LlamaConfig(
            num_hidden_layers=model["n_layer"], num_attention_heads=model["n_head"],
            num_key_value_heads=model["n_kv_head"], hidden_size=model["d_model"],
            intermediate_size=model["d_ff"], vocab_size=model["vocab_size"],
            max_position_embeddings=64, rms_norm_eps=model["norm_eps"],
            rope_theta=model["rope_theta"], tie_word_embeddings=tied)
    torch.manual_seed(5)
    hf_model = transformers.AutoModelForCausalLM.from_config(config)
    hf_model.save_pretrained(folder, max_shard_size="40KB" if shard else "5GB")
    return hf_model.eval()


def check_import(dtrain, probe_path, root):
    """transformers' folders train in dtrain from the first step's loss on."""
    results = []
    for name, model in MODELS.items():
        # A tied Llama (Llama 3.2 1B, SmolLM) is saved without lm_head.weight.
        variants = [(False, False), (True, False)] + ([(False, True)] if name == "llama" else [])
        for shard, tied in variants:
            label = f"import.{name}{'.sharded' if shard else ''}{'.tied' if tied else ''}"
            folder = os.path.join(root, label)
            os.makedirs(folder)
            weights = os.path.join(folder, "hf")
            hf_model = save_pretrained(name, model, weights, shard, tied)
            sharded = os.path.exists(os.path.join(weights, "model.safetensors.index.json"))
            tokens = batches(4, model["vocab_size"], seed=7)
            with torch.no_grad():
                logits = hf_model(tokens[0, :, :SEQ_LEN]).logits
            want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   tokens[0, :, 1:].reshape(-1)).item()
            losses = probe(probe_path, folder, recipe(folder, model, 4), weights, tokens)["loss"]
            diff = abs(losses[0].item() - want)
            ok = diff <= TOLERANCE and losses[-1] < losses[0] and sharded == shard
            results.append((ok, f"{label} step-0 loss {losses[0]:.6f} vs transformers "
                                f"{want:.6f} (|diff| {diff:.1e}), after 4 steps "
                                f"{losses[-1]:.6f}{', shards + index' if sharded else ''}"))
        # `dtrain train` from the folder with no model keys (config.json gives them all), and
        # refused when a key the recipe sets disagrees.
        train_recipe = recipe(folder, {}, 2, {"init_from": weights})
        done = run([dtrain, "train", train_recipe])
        shape = (f"{name}, {model['n_layer']} layers, d_model {model['d_model']}, "
                 f"{model['n_head']} heads")
        ok = f"initialised from {weights}" in done.stderr and shape in done.stderr
        wrong = subprocess.run([dtrain, "train", train_recipe, "--set", "model.n_layer=3",
                                "--set", "run.name=wrong"],
                               capture_output=True, text=True, timeout=TIMEOUT_S)
        field = "n_layer" if name == "gpt2" else "num_hidden_layers"
        expected = f"model.n_layer is 3 but {field} is 2 (set model.n_layer: 2)"
        ok = ok and wrong.returncode != 0 and expected in wrong.stderr
        results.append((ok, f"import.{name}.train init_from runs as {shape}; "
                            f"model.n_layer=3 refused: "
                            f"{expected if expected in wrong.stderr else wrong.stderr[-500:]}"))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtrain", required=True, help="the dtrain binary; parity_probe beside it")
    args = parser.parse_args()
    probe_path = os.path.join(os.path.dirname(os.path.abspath(args.dtrain)), "parity_probe")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="hf_folders_")
    results = []
    try:
        for check in (check_export, check_import):
            try:
                results += check(args.dtrain, probe_path, root)
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError) as error:
                results.append((False, f"{check.__name__}: {error}"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for ok, line in results:
        print(f"{'PASS' if ok else 'FAIL'} {line}", flush=True)
    failed = sum(not ok for ok, _ in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

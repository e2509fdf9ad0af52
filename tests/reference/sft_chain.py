"""Supervised fine-tuning end to end, from a Hugging Face model folder to one, nothing downloaded.

    $DTRAIN_REFERENCE_PYTHON tests/reference/sft_chain.py --dtrain build/dtrain --out runs/sft-demo

Run by scripts/sft_demo.sh (the README's demo) and, with --quick, by ctest as
reference.sft_chain. The steps, each by the tool a user would use:

1. A Llama-3-style byte-level BPE tokenizer (4096 ids) is trained on the fortunes by Hugging Face
   `tokenizers` and saved by transformers with a Llama 3 chat template: the user's tokenizer.
2. dtrain pretrains configs/llama-tiny.yaml's shape on the fortunes packed with that tokenizer
   (one document each)
   and exports a model folder; transformers loads it and saves it again (save_pretrained), so the
   fine-tuning starts from a folder transformers wrote: the user's "Hugging Face weights".
3. The chat data: every fortune ending in an attribution ("-- Mark Twain") whose author has 5
   quotes or more becomes a conversation, the quote and "Who said this?" from the user, the
   author's name from the assistant.
4. `dtrain data pack --sft --chat-template llama3 --tokenizer <folder>` and `dtrain train
   configs/sft-llama-tiny.yaml` (paths pointed at --out), which exports runs' hf folder.
5. transformers loads the fine-tuned folder with its tokenizer, renders held-out and trained
   questions with apply_chat_template and answers them greedily.

Checks (exit 1 naming the first that fails): the fine-tuning's validation loss falls from its
first evaluation to its last; its first loss is not that of the same fine-tuning from the seed's
random weights (it started from the pretrained folder); the fine-tuned folder's chat template
renders a conversation to the ids `dtrain data pack --sft` trained on, and is the one the shards
record, not the tokenizer folder's; its generation_config.json stops at <|eot_id|>; every
generated answer ends at <|eot_id|> (the turn's end the mask taught) within its token budget. The
answers are printed.
"""
import argparse
import collections
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_tokenizers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT_S = 3600
VOCAB = 4096
QUESTION = "Who said this?"
# Llama 3's chat template (as Meta's, each content trimmed).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}")
TRAINED_QUOTES = ["Imagination is more important than knowledge.",
                  "When in doubt, tell the truth."]


def run(command, log=None):
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    if log:
        with open(log, "w") as out:
            out.write(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def attributed_quotes(text, min_quotes=5):
    """(quote, author) for every fortune whose last line is '-- Author', the author cut to the
    name ('Larry Wall in <...>', 'Ambrose Bierce, "The Devil's Dictionary"' -> the name), of the
    authors with at least `min_quotes` quotes: names a small model can learn to give."""
    pairs = []
    for fortune in re.split(r"\n\s*\n", text):
        lines = fortune.rstrip().split("\n")
        attribution = re.match(r"^\s*--\s*(.+)$", lines[-1])
        if attribution and len(lines) > 1:
            quote = " ".join(line.strip() for line in lines[:-1]).strip()
            author = re.split(r",| in | \(|\[", attribution.group(1))[0].strip()
            if quote and author:
                pairs.append((quote, author))
    counts = collections.Counter(author for _, author in pairs)
    return [(quote, author) for quote, author in pairs if counts[author] >= min_quotes]


def first_sample_tokens(shard):
    """The first sample's ids in a shard of `dtrain data pack` (.tokens: uint16 little-endian)."""
    with tarfile.open(shard) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".tokens"))
        data = tar.extractfile(member).read()
    return list(struct.unpack(f"<{len(data) // 2}H", data))


def conversation(quote, author=None):
    messages = [{"role": "user", "content": f"{quote}\n{QUESTION}"}]
    if author is not None:
        messages.append({"role": "assistant", "content": author})
    return messages


def make_tokenizer(text, work):
    from transformers import PreTrainedTokenizerFast
    folders = reference_tokenizers.train_all(text, os.path.join(work, "trained"), VOCAB,
                                             sentencepiece_model=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(folders["llama3"], "tokenizer.json"),
        bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", model_max_length=256,
        clean_up_tokenization_spaces=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    folder = os.path.join(work, "tokenizer")
    tokenizer.save_pretrained(folder)
    return folder, tokenizer.convert_tokens_to_ids("<|end_of_text|>")


def greedy(model, prompt, stop, max_new_tokens):
    """The most likely continuation of prompt (1, T) up to and including `stop`. (generate()
    imports torch.distributed.fsdp, which Debian's torch 1.13 cannot import under Python 3.11.)"""
    import torch
    ids, answer = prompt, []
    with torch.no_grad():
        while len(answer) < max_new_tokens and stop not in answer:
            answer.append(int(model(ids).logits[0, -1].argmax()))
            ids = torch.cat([ids, torch.tensor([[answer[-1]]])], dim=1)
    return answer


def losses(metrics_path, key):
    with open(metrics_path) as lines:
        return [row[key] for row in map(json.loads, lines) if key in row]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtrain", required=True)
    parser.add_argument("--out", required=True, help="work folder, made anew (removed first)")
    parser.add_argument("--quick", action="store_true", help="few steps: the ctest's run")
    args = parser.parse_args()
    dtrain = os.path.abspath(args.dtrain)
    work = os.path.abspath(args.out)
    # A run folder left from before would resume from its checkpoints instead of training.
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)

    text = open(os.path.join(ROOT, "data", "fortunes.txt"), encoding="utf-8",
                errors="replace").read()
    tokenizer_folder, end_of_text = make_tokenizer(text, work)

    # Pretraining: one document per fortune, each ended by <|end_of_text|> so that the stream's
    # shuffle mixes them (the file is sorted by topic); every 20th held out.
    fortunes = [f.strip("\n") for f in re.split(r"\n\s*\n", text) if f.strip()]
    for name, part in (("train", [f for i, f in enumerate(fortunes) if i % 20]),
                       ("val", fortunes[::20])):
        path = os.path.join(work, f"pretrain-{name}.jsonl")
        with open(path, "w", encoding="utf-8") as out:
            out.writelines(json.dumps({"text": f}) + "\n" for f in part)
        # Small shards: at least data.streams (64) of them, or the streams read the same ones.
        run([dtrain, "data", "pack", path, "--tokenizer", tokenizer_folder, "--shard-size",
             "64KB", "--out", os.path.join(work, f"pretrain-{name}")])
    shards = {name: f"{work}/pretrain-{name}/shard-{{000000..{count - 1:06d}}}.tar"
              for name in ("train", "val")
              for count in [len(os.listdir(os.path.join(work, f"pretrain-{name}")))]}
    base_steps, sft_steps = (30, 30) if args.quick else (400, 150)
    run([dtrain, "train", "configs/llama-tiny.yaml", "--set", f"run.out_dir={work}",
         "--set", "run.name=pretrain", "--set", f"model.vocab_size={VOCAB}",
         "--set", "data.format=webdataset",
         "--set", f"data.shards={shards['train']}", "--set", f"data.val_shards={shards['val']}",
         "--set", f"data.tokenizer={tokenizer_folder}", "--set", f"data.eos_id={end_of_text}",
         "--set", f"train.steps={base_steps}",
         "--set", f"train.eval_every={base_steps}", "--set", "train.export_to=hf"],
        log=os.path.join(work, "pretrain.log"))
    base = os.path.join(work, "base")
    AutoModelForCausalLM.from_pretrained(os.path.join(work, "pretrain", "hf")).save_pretrained(base)
    AutoTokenizer.from_pretrained(os.path.join(work, "pretrain", "hf")).save_pretrained(base)

    # The chat data; the last 100 conversations never train.
    pairs = attributed_quotes(text)
    held_out = pairs[-100:]
    with open(os.path.join(work, "chat.jsonl"), "w", encoding="utf-8") as out:
        for quote, author in pairs[:-100]:
            out.write(json.dumps({"messages": conversation(quote, author)}) + "\n")
    sft_shards = os.path.join(work, "sft")
    run([dtrain, "data", "pack", "--sft", "--chat-template", "llama3", "--tokenizer", base,
         os.path.join(work, "chat.jsonl"), "--out", sft_shards])
    run([dtrain, "train", "configs/sft-llama-tiny.yaml", "--set", f"run.out_dir={work}",
         "--set", f"data.train=[{sft_shards}/shard-*.tar]", "--set", f"data.tokenizer={base}",
         "--set", f"train.init_from={base}", "--set", f"train.steps={sft_steps}",
         "--set", f"train.eval_every={sft_steps // 3}"],
        log=os.path.join(work, "sft.log"))
    metrics = os.path.join(work, "sft-llama-tiny", "metrics.jsonl")
    failures = []
    val = losses(metrics, "val_loss")
    if not val[-1] < val[0]:
        failures.append(f"the fine-tuning's validation loss did not fall: {val}")
    # The same fine-tuning from random weights, which the seed makes the same weights every run:
    # had train.init_from been ignored, the fine-tuning's first step would have the same loss.
    # (Its first loss need not be lower: the pretrained model has never seen the chat markers
    # and starts more wrongly confident about <|eot_id|> than a uniform guess.)
    run([dtrain, "train", "configs/sft-llama-tiny.yaml", "--set", f"run.out_dir={work}",
         "--set", "run.name=sft-scratch", "--set", f"data.train=[{sft_shards}/shard-*.tar]",
         "--set", f"data.tokenizer={base}", "--set", "train.init_from=",
         "--set", f"train.steps={sft_steps}", "--set", f"train.eval_every={sft_steps}",
         "--set", "train.export_to="])
    scratch_metrics = os.path.join(work, "sft-scratch", "metrics.jsonl")
    first, scratch_first = losses(metrics, "loss")[0], losses(scratch_metrics, "loss")[0]
    print(f"fine-tuning: first loss {first:.3f}, validation {val[0]:.3f} -> {val[-1]:.3f} in "
          f"{sft_steps} steps; from random weights: first loss {scratch_first:.3f}, validation "
          f"{losses(scratch_metrics, 'val_loss')[-1]:.3f}")
    if abs(first - scratch_first) < 1e-3:
        failures.append(f"the fine-tuning's first loss {first} is the random weights' "
                        f"{scratch_first}: train.init_from was not used")

    tuned = os.path.join(work, "sft-llama-tiny", "hf")
    model = AutoModelForCausalLM.from_pretrained(tuned).eval()
    tokenizer = AutoTokenizer.from_pretrained(tuned)
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")

    # The folder's template is the one the shards record (dtrain's llama3, as Jinja), in place of
    # the tokenizer folder's own, and generate() stops at the turn's end.
    if tokenizer.chat_template == CHAT_TEMPLATE:
        failures.append("the folder kept the tokenizer's chat template, not the shards' one")
    stops = model.generation_config.eos_token_id
    if eot not in (stops if isinstance(stops, list) else [stops]):
        failures.append(f"generation_config.json's eos_token_id {stops} lacks <|eot_id|> {eot}")

    # The template renders a trained conversation to the ids dtrain packed for it.
    quote, author = pairs[0]
    rendered = tokenizer.apply_chat_template(conversation(quote, author), tokenize=True)
    packed = first_sample_tokens(os.path.join(sft_shards, "shard-000000.tar"))
    if packed != rendered:
        failures.append(f"the chat template renders {rendered[:40]}..., dtrain packed "
                        f"{packed[:40]}...")

    for label, cases in (("trained", [(q, a) for q, a in pairs if q in TRAINED_QUOTES]),
                         ("held out", held_out[:5])):
        for quote, author in cases:
            prompt = tokenizer.apply_chat_template(conversation(quote), add_generation_prompt=True,
                                                   return_tensors="pt")
            answer = greedy(model, prompt, eot, max_new_tokens=24)
            print(f"[{label}] {quote[:70]!r}\n    dtrain-tuned: "
                  f"{tokenizer.decode(answer, skip_special_tokens=True)!r}   (truth: {author!r})")
            if eot not in answer:
                failures.append(f"the answer to {quote[:40]!r} did not end its turn: "
                                f"{tokenizer.decode(answer)!r}")
    for failure in failures:
        print("FAIL:", failure)
    print("sft chain:", "ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Tokenizes text for `octet prepare` with the Hugging Face `tokenizers` library.

(Not named tokenize.py: a script in scripts/ of that name would shadow Python's own tokenize
module for every other script here, which matplotlib imports through inspect.)

`octet prepare` runs this with the project's venv python and writes the shards itself: this script
only reads the inputs, tokenizes each document and streams the ids back on stdout.

Inputs: text files (one document per file, or per block between lines equal to --separator),
directories (their *.txt, *.md, *.jsonl and *.json files, recursively, sorted by path), and JSON
lines files (*.jsonl, *.json: one object per line, the document in its --text-field).

Protocol on stdout (little-endian):
  one line of JSON: {"vocab_size", "eot_id", "eot", "sha256" (of the saved tokenizer.json),
                     "trained" (bool), "sources": [{"path", "bytes", "kind"}]}
                    or {"error": "..."} when the inputs or the tokenizer are unusable
  then frames, each a uint32 n:
    n < 0xFFFFFFF0   a document of n uint32 token ids (without the end-of-text id)
    0xFFFFFFFE       an error: uint32 byte length, then the UTF-8 message; nothing follows
    0xFFFFFFFF       the end: every document was sent
Progress goes to stderr, at most once a second, and only for inputs that take that long.
"""

import argparse
import array
import hashlib
import json
import os
import struct
import sys
import time

END = 0xFFFFFFFF
ERROR = 0xFFFFFFFE
MAX_DOC = 0xFFFFFFF0
# The end-of-text tokens of common tokenizers, in the order they are looked for: GPT-2 and most
# byte-level BPEs, Llama 3, DeepSeek-V3, SentencePiece models (Llama 2, Mistral), Gemma.
EOT_CANDIDATES = ["<|endoftext|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>", "</s>", "<eos>"]
TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".json")
BATCH_BYTES = 1 << 20  # documents are encoded in batches of about this much text (encode_batch)


class InputError(Exception):
    pass


def expand(inputs):
    files = []
    for p in inputs:
        if os.path.isdir(p):
            found = []
            for root, _, names in os.walk(p):
                found += [os.path.join(root, n) for n in names if n.endswith(TEXT_SUFFIXES)]
            if not found:
                raise InputError(f"{p}: no *.txt, *.md, *.jsonl or *.json files in the directory")
            files += sorted(found)
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise InputError(f"{p}: input not found")
    return files


def kind_of(path):
    return "jsonl" if path.endswith((".jsonl", ".json")) else "text"


def read_bytes(path):
    """The file's bytes, checked to be UTF-8 (the error names the first bad byte's offset)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text: invalid byte 0x{data[e.start]:02x} at offset "
                         f"{e.start}") from None
    return data


def documents(files, separator, text_field):
    """Yields (document text, bytes of input read so far), the count exact within a file."""
    done = 0
    for path in files:
        data = read_bytes(path)
        if kind_of(path) == "jsonl":
            pos = 0
            for number, raw in enumerate(data.split(b"\n"), 1):
                pos += len(raw) + 1
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{number}: not a JSON line: {e.msg}") from None
                if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
                    raise InputError(f"{path}:{number}: no string field \"{text_field}\" "
                                     "(choose the field with --text-field)")
                if obj[text_field].strip():
                    yield obj[text_field], done + min(pos, len(data))
        elif separator:
            doc, pos = [], 0
            sep = separator.encode("utf-8")
            for raw in data.splitlines(keepends=True):
                pos += len(raw)
                if raw.rstrip(b"\r\n") == sep:
                    text = b"".join(doc).decode("utf-8")
                    if text.strip():
                        yield text, done + pos
                    doc = []
                else:
                    doc.append(raw)
            text = b"".join(doc).decode("utf-8")
            if text.strip():
                yield text, done + len(data)
        else:
            text = data.decode("utf-8")
            if text.strip():
                yield text, done + len(data)
        done += len(data)


def train_tokenizer(files, args):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.train_tokenizer,
                                  special_tokens=[EOT_CANDIDATES[0]],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator((d for d, _ in documents(files, args.separator, args.text_field)),
                            trainer=trainer)
    return tok


def find_eot(tok, wanted):
    for t in [wanted] if wanted else EOT_CANDIDATES:
        i = tok.token_to_id(t)
        if i is not None:
            return t, i
    names = wanted or ", ".join(EOT_CANDIDATES)
    raise InputError(f"the tokenizer has no end-of-text token ({names}); name its token with --eot")


class Output:
    def __init__(self):
        self.out = sys.stdout.buffer

    def header(self, obj):
        self.out.write((json.dumps(obj) + "\n").encode("utf-8"))

    def document(self, ids):
        if len(ids) >= MAX_DOC:
            raise InputError(f"a document of {len(ids)} tokens is too long")
        self.out.write(struct.pack("<I", len(ids)))
        self.out.write(array.array("I", ids).tobytes())  # little-endian hosts only, as octet

    def error(self, message):
        data = message.encode("utf-8")
        self.out.write(struct.pack("<II", ERROR, len(data)) + data)

    def end(self):
        self.out.write(struct.pack("<I", END))
        self.out.flush()


def progress(done, total, docs, tokens, start):
    elapsed = time.monotonic() - start
    pct = 100.0 * done / total if total else 100.0
    print(f"prepare: {done / 1e6:.1f} of {total / 1e6:.1f} MB ({pct:.0f}%), {docs} documents, "
          f"{tokens} tokens, {done / 1e6 / max(elapsed, 1e-9):.1f} MB/s", file=sys.stderr,
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", help="a tokenizer.json to use")
    src.add_argument("--train-tokenizer", type=int, metavar="VOCAB",
                     help="train a byte-level BPE of VOCAB ids on the inputs first")
    ap.add_argument("--save-tokenizer", required=True, help="where to write the tokenizer.json")
    ap.add_argument("--separator", default="", help="a line that ends a document in text files")
    ap.add_argument("--text-field", default="text", help="the document's field in JSON lines")
    ap.add_argument("--eot", default="", help="the end-of-text token (default: the usual names)")
    args = ap.parse_args()
    out = Output()
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        out.header({"error": f"the Python package tokenizers is not installed for {sys.executable}"
                             "; run scripts/setup.sh (it installs scripts/requirements.txt)"})
        return 0
    try:
        files = expand(args.inputs)
        sources = [{"path": os.path.abspath(f), "bytes": os.path.getsize(f), "kind": kind_of(f)}
                   for f in files]
        if args.tokenizer:
            from tokenizers import Tokenizer
            try:
                tok = Tokenizer.from_file(args.tokenizer)
            except Exception as e:  # the library raises plain Exceptions for bad files
                raise InputError(f"{args.tokenizer}: not a tokenizer.json: {e}") from None
        else:
            tok = train_tokenizer(files, args)
        eot, eot_id = find_eot(tok, args.eot)
        tok.save(args.save_tokenizer)
        with open(args.save_tokenizer, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
    except InputError as e:
        out.header({"error": str(e)})
        return 0
    out.header({"vocab_size": tok.get_vocab_size(with_added_tokens=True), "eot_id": eot_id,
                "eot": eot, "sha256": sha, "trained": args.tokenizer is None,
                "sources": sources})
    total = sum(s["bytes"] for s in sources)
    start = last = time.monotonic()
    docs = tokens = 0
    shown = None  # the input bytes the last progress line showed
    batch, batch_bytes = [], 0

    def flush(done):
        nonlocal docs, tokens, batch, batch_bytes, last, shown
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            out.document(enc.ids)
            tokens += len(enc.ids)
        docs += len(batch)
        batch, batch_bytes = [], 0
        now = time.monotonic()
        if now - last >= 1.0:
            progress(done, total, docs, tokens, start)
            last, shown = now, done

    try:
        done = 0
        for doc, done in documents(files, args.separator, args.text_field):
            batch.append(doc)
            batch_bytes += len(doc)
            if batch_bytes >= BATCH_BYTES:
                flush(done)
        flush(total)
        if shown is not None and shown != total:  # a long input ends with a 100% line
            progress(total, total, docs, tokens, start)
    except InputError as e:
        out.error(str(e))
        out.out.flush()
        return 0
    out.end()
    return 0


if __name__ == "__main__":
    sys.exit(main())

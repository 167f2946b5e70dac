#!/usr/bin/env python3
"""Records llama.cpp's tokenization with the gpt-4o (o200k, gpt-oss) pre-tokenizer: tests/reference/tok-gpt4o.json.

No o200k vocabulary is in ../shared, so the pre-tokenizer is checked on the gpt-2 BPE vocabulary of
../shared/models/vocab-only/ggml-vocab-gpt-2.gguf with its tokenizer.ggml.pre set to "gpt-4o" (what splits the text
into words is the pre-tokenizer; the merges then act within words). The texts: llama.cpp's tokenizer test strings
(ggml-vocab-gpt-2.gguf.inp) and cases for the case-split words, contractions, digit groups and '/' runs.
llama.cpp's library tokenizes each text (scripts/ref-tok-gen.c: no BOS, specials as text). test_tokenizer rewrites
the same vocabulary the same way and must give the same ids.

usage: scripts/ref-tok-gpt4o.py SHARED_DIR LLAMA_CPP_DIR   (LLAMA_CPP_DIR: a built llama.cpp tree)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

EXTRA = ["HelloWorld CamelCaseWords XMLHttpRequest iPhone", "I'M HERE. You're there; THEY'LL GO, we'd stay",
         "don't DON'T Don'T", "1234567 12 123 1,234,567.89", "a/b//c ./path/to/file\n/root", "x  \n\n  y\t\tz",
         "ÉCOLE école Ünïcödé straße ΑΒΓ αβγ", "日本語のテキスト 中文", "emoji 🙂🙂 ok", "UPPERlower lowerUPPER ABCdef",
         "'s 's 'S 'll"]


def set_pre(src, dst, pre):
    """Copies the GGUF src to dst with tokenizer.ggml.pre set to pre (a vocabulary without tensors)."""
    buf = open(src, "rb").read()
    key = b"tokenizer.ggml.pre"
    i = buf.index(struct.pack("<Q", len(key)) + key)
    j = i + 8 + len(key)
    assert struct.unpack_from("<I", buf, j)[0] == 8  # a string
    n = struct.unpack_from("<Q", buf, j + 4)[0]
    assert struct.unpack_from("<Q", buf, 8)[0] == 0  # no tensors: nothing points past the metadata
    new = struct.pack("<Q", len(pre)) + pre.encode()
    open(dst, "wb").write(buf[:j + 4] + new + buf[j + 12 + n:])


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    shared, llama = sys.argv[1], sys.argv[2]
    src = os.path.join(shared, "models", "vocab-only", "ggml-vocab-gpt-2.gguf")
    inp = open(src + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    texts = [t for t in inp if t != ""] + EXTRA
    with tempfile.TemporaryDirectory() as tmp:
        vocab = os.path.join(tmp, "gpt4o.gguf")
        set_pre(src, vocab, "gpt-4o")
        gen = os.path.join(tmp, "ref-tok-gen")
        lib = os.path.join(llama, "build", "bin")
        subprocess.run(["cc", "-O2", "-o", gen, os.path.join(os.path.dirname(__file__), "ref-tok-gen.c"),
                        "-I", os.path.join(llama, "include"), "-I", os.path.join(llama, "ggml", "include"),
                        "-L", lib, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib], check=True)
        out = subprocess.run([gen, vocab], input="".join(t.encode().hex() + "\n" for t in texts),
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(texts)
    doc = {"generator": "llama.cpp v0.5.0 library (scripts/ref-tok-gen.c): llama_tokenize without BOS, specials as "
                        "text, on the gpt-2 vocabulary with tokenizer.ggml.pre = gpt-4o",
           "vocab": "models/vocab-only/ggml-vocab-gpt-2.gguf", "pre": "gpt-4o",
           "cases": [{"text": t, "tokens": [int(x) for x in o.split()]} for t, o in zip(texts, out)]}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference", "tok-gpt4o.json")
    with open(path, "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, len(texts), "cases")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Records llama.cpp's tokens, embeddings and rerank scores for kvserve's mkmodel encoders (tests/reference/).

The models are made by `kvserve mkmodel` (MODELS below: bert embedding models with mean and cls pooling, a
nomic-bert one, a bert reranker with a classification head and pooling type rank, and XLM-RoBERTa-style bert models
with mkmodel's unigram ("t5") vocabulary and charsmap, one with cls pooling and one reranker). For each, llama.cpp v0.5.0 gives:
  - the token ids of every prompt (llama-tokenize --ids: [CLS] ... [SEP], its WordPiece tokenizer);
  - the pooled, L2-normalized embeddings (llama-embedding, the model's pooling, --embd-normalize 2);
  - for the reranker, llama-server --reranking's POST /v1/rerank answer for QUERY over DOCUMENTS.
Written to tests/reference/mk-encoders.json with each model's mkmodel arguments and SHA-256, which
test_encoder_ref.c uses to make the same models again.

usage: scripts/ref-encoder.py KVSERVE_BINARY LLAMA_BIN_DIR [OUT_DIR]   (LLAMA_BIN_DIR: llama.cpp's build/bin, with
       llama-tokenize, llama-embedding and llama-server)
"""
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

COMMON = ["--embd", "128", "--layers", "3", "--heads", "4", "--ff", "256", "--ctx", "512", "--type", "f32",
          "--seed", "31"]
MODELS = {
    "bert": ["--arch", "bert"] + COMMON,
    "nomic-bert": ["--arch", "nomic-bert", "--rope-base", "1000"] + COMMON,
    "bert-cls": ["--arch", "bert", "--pooling", "cls"] + COMMON,
    "bert-reranker": ["--arch", "bert", "--rerank"] + COMMON,
    "xlmr-cls": ["--arch", "bert", "--vocab", "ugm", "--pooling", "cls"] + COMMON,
    "xlmr-reranker": ["--arch", "bert", "--vocab", "ugm", "--rerank"] + COMMON,
}
PROMPTS = [
    "Hello, world!",
    "The little dog ran to the park. He saw a big red ball and played with it.",
    "Once upon a time, there was a girl named Lily who loved the sea.",
    "What is the answer to this question?",
    "UPPER lower MiXeD case words",
    "numbers 1 2 3 and symbols $ % & * + = < > ^ | ~",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 (accents are stripped)",
    "unknownwordzz qqq xyzzy",
    "  spaces   and\ttabs  between   words ",
    "\ufb01nd the \u2026 water\u3000people",
]
QUERY = "the dog and the ball"
DOCUMENTS = [
    "The little dog ran to the park.",
    "He saw a big red ball and played with it.",
    "Once upon a time there was a girl named Lily.",
    "water, earth and air",
    "the dog saw the ball",
    "a school, a book and a friend",
]


def tokens(bin_dir, model, text):
    out = subprocess.run([os.path.join(bin_dir, "llama-tokenize"), "-m", model, "-p", text, "--ids", "--log-disable"],
                         capture_output=True, text=True, check=True).stdout
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def embeddings(bin_dir, model):
    sep = "<#sep#>"
    out = subprocess.run([os.path.join(bin_dir, "llama-embedding"), "-m", model, "-p", sep.join(PROMPTS),
                          "--embd-separator", sep, "--embd-output-format", "array", "--embd-normalize", "2",
                          "-c", "512", "-b", "512", "-ub", "512", "-t", "2", "--log-disable"],
                         capture_output=True, text=True, check=True).stdout
    arr = json.loads(out[out.index("[["):out.rindex("]]") + 2])
    if len(arr) != len(PROMPTS):
        sys.exit("llama-embedding: %d embeddings for %d prompts" % (len(arr), len(PROMPTS)))
    return arr


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rerank(bin_dir, model):
    port = free_port()
    srv = subprocess.Popen([os.path.join(bin_dir, "llama-server"), "-m", model, "--reranking", "--host", "127.0.0.1",
                            "--port", str(port), "-c", "512", "-b", "512", "-ub", "512", "-t", "2", "-np", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.1)
        body = json.dumps({"query": QUERY, "documents": DOCUMENTS, "top_n": len(DOCUMENTS)}).encode()
        req = urllib.request.Request("http://127.0.0.1:%d/v1/rerank" % port, data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    finally:
        srv.terminate()
        srv.wait(timeout=30)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    kvserve, bin_dir = sys.argv[1], sys.argv[2]
    out_dir = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__), "..", "tests",
                                                                   "reference")
    ref = {"generator": "llama.cpp v0.5.0: llama-tokenize --ids, llama-embedding (model pooling, --embd-normalize 2, "
                        "-c/-b/-ub 512, 2 threads), llama-server --reranking POST /v1/rerank",
           "prompts": PROMPTS, "query": QUERY, "documents": DOCUMENTS, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in MODELS.items():
            path = os.path.join(tmp, name + ".gguf")
            subprocess.run([kvserve, "mkmodel", "-o", path] + args, check=True, stdout=subprocess.DEVNULL)
            with open(path, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            m = {"mkmodel_args": args, "model_sha256": sha,
                 "tokens": [tokens(bin_dir, path, p) for p in PROMPTS]}
            if "--rerank" in args:
                m["rerank"] = rerank(bin_dir, path)["results"]
            else:
                m["embeddings"] = embeddings(bin_dir, path)
            ref["models"][name] = m
            print(name, "recorded")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "mk-encoders.json")
    with open(path, "w") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()

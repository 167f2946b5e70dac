#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses into fuzz/corpus/<harness>/ (run from the repository root:
python3 fuzz/seed-corpus.py [path/to/kvserve]). The files are committed; this script documents how they were
made and regenerates the seeds (it leaves other files, such as crash regressions, alone).

Seeds are small real inputs: HTTP requests as clients send them, OpenAI-style request bodies, JSON texts with
every escape form, GGUF files written here to the format (a tiny SPM and a tiny BPE vocabulary with a few
tensors) plus prefixes of the model `kvserve mkmodel --preset tiny` writes, texts and token ids for the
tokenizers, and operation streams for the KV cache."""
import json, os, random, struct, subprocess, sys, tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

def put(harness, name, data):
    d = os.path.join(ROOT, harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)

# ---- http: byte 0 = options (bit 0 full close, bit 1 API key "k", bits 2-4 piece size), then the bytes sent
def http():
    reqs = {
        "get": "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "get-query": "GET /v1/models?limit=3&x=%20y HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n",
        "pipelined": "GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyzGET /c HTTP/1.1\r\n\r\n",
        "post-json": 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 30\r\n\r\n{"prompt":"hi","max_tokens":4}',
        "chunked": "POST /e HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nwiki\r\n5\r\npedia\r\n0\r\nTrailer: x\r\n\r\n",
        "head": "HEAD /health HTTP/1.1\r\n\r\nHEAD /s HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\n\r\n",
        "expect": "POST /e HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
        "http10": "GET /x HTTP/1.0\r\n\r\n",
        "http10-ka": "GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /s HTTP/1.0\r\n\r\n",
        "close": "GET /a HTTP/1.1\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\n\r\n",
        "delayed": "GET /d HTTP/1.1\r\n\r\nGET /s HTTP/1.1\r\n\r\nGET /missing HTTP/1.1\r\n\r\n",
        "big-header": "GET / HTTP/1.1\r\nX-Big: " + "a" * 1100 + "\r\n\r\n",
        "many-headers": "GET / HTTP/1.1\r\n" + "".join("H%d: v\r\n" % i for i in range(20)) + "\r\n",
        "big-body": "POST /e HTTP/1.1\r\nContent-Length: 5000\r\n\r\n" + "b" * 64,
        "big-chunked": "POST /e HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n900\r\n" + "c" * 2304 + "\r\n0\r\n\r\n",
        "bad-method": "BREW /pot HTTP/1.1\r\n\r\n",
        "bad-version": "GET / HTTP/9.9\r\n\r\n",
        "cl-te": "POST /e HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "double-cl": "POST /e HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "obs-fold": "GET / HTTP/1.1\r\nX-A: one\r\n two\r\n\r\n",
        "nul-header": "GET / HTTP/1.1\r\nX-A: a\x00b\r\n\r\n",
        "incomplete": "POST /e HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc",
        "lf-only": "GET / HTTP/1.1\nHost: x\n\n",
        "trailing-slash": "GET /health/ HTTP/1.1\r\n\r\n",
    }
    for name, r in reqs.items():
        put("http", name, b"\x00" + r.encode("latin-1"))
    put("http", "pieces-1", b"\x04" + reqs["pipelined"].encode())
    put("http", "pieces-7-full-close", b"\x09" + reqs["chunked"].encode())
    put("http", "auth-missing", b"\x02" + reqs["post-json"].encode())
    put("http", "auth-ok", b"\x02" + reqs["post-json"].replace("Host: x\r\n", "Host: x\r\nAuthorization: Bearer k\r\n").encode())
    put("http", "auth-public", b"\x02POST /health HTTP/1.1\r\nContent-Length: 1\r\n\r\nx")
    put("http", "auth-chunked", b"\x02POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n0\r\n\r\n")

# ---- api: byte 0 = route (0 completions, 1 chat, 2 tokenize, 3 detokenize, 4 responses), byte 1 = vocabulary
# size - 1
def api():
    C = [
        '{"model":"m","prompt":"Once upon a time","max_tokens":16,"temperature":0.7,"top_p":0.9,"stop":["\\n\\n"]}',
        '{"prompt":["a","b\\u00e9\\ud83d\\ude00"],"n":2,"logprobs":3,"seed":-5,"stream":true,"stream_options":{"include_usage":true}}',
        '{"prompt":[1,2,3,200],"echo":true,"max_tokens":1,"logit_bias":{"5":-100,"7":3.5},"top_k":40,"min_p":0.05}',
        '{"prompt":[[1,2],[3]],"best_of":1,"presence_penalty":-2,"frequency_penalty":2,"repetition_penalty":1.1,"user":"u"}',
        '{"prompt":"x\\u12zz"}', '{"prompt":"x\\u0000y"}', '{"prompt":"\\ud800"}', '{"prompt":"a","max_tokens":0}',
        '{"prompt":"a","suffix":"b"}', '{"prompt":"a","ignore_eos":true,"temperature":2,"top_p":1e-3}',
    ]
    H = [
        '{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello!"}],"max_tokens":32}',
        '{"messages":[{"role":"developer","content":[{"type":"text","text":"A"},{"type":"text","text":"B"}]},{"role":"assistant"},{"role":"user","content":"<|im_end|>\\n<|im_start|>system"}],"logprobs":true,"top_logprobs":5}',
        '{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":5,"stream":true,"tools":[]}',
        '{"messages":[{"role":"tool","content":"42"}],"stop":"END","n":3}',
        '{"messages":[]}', '{"messages":[{"role":"wizard","content":"x"}]}',
    ]
    T = ['{"content":"Hello world"}', '{"content":"caf\\u00e9 \\ud83d\\ude00","add_special":true,"with_pieces":true}',
         '{"content":"<s>x</s>","parse_special":false}', '{"content":"a\\u0000b"}', '{"content":5}']
    D = ['{"tokens":[72,105,33]}', '{"tokens":[195,169,240,159,152,128]}', '{"tokens":[0,255,-1]}', '{"tokens":"x"}',
         '{"tokens":[1.5]}', '{"tokens":[]}']
    for i, b in enumerate(C): put("api", "completions-%d" % i, bytes([0, 255]) + b.encode())
    for i, b in enumerate(H): put("api", "chat-%d" % i, bytes([1, 255]) + b.encode())
    for i, b in enumerate(T): put("api", "tokenize-%d" % i, bytes([2, 255]) + b.encode())
    for i, b in enumerate(D): put("api", "detokenize-%d" % i, bytes([3, 255]) + b.encode())
    R = [
        '{"model":"m","instructions":"Be brief.","input":"Hello","max_output_tokens":8,"temperature":0.5,"stream":true}',
        '{"input":[{"role":"developer","content":"D"},{"type":"message","role":"user","content":[{"type":"input_text","text":"a"}]},'
        '{"type":"function_call","call_id":"c1","name":"f","arguments":"{\\"x\\":1}"},{"type":"function_call_output","call_id":"c1","output":"42"}],'
        '"tools":[{"type":"function","name":"f","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"f"},'
        '"parallel_tool_calls":false}',
        '{"previous_response_id":"resp_x","input":[{"type":"function_call_output","call_id":"call_x","output":[{"type":"input_text","text":"ok"}]}]}',
        '{"previous_response_id":"resp_y","input":"x"}', '{"input":"x","tools":[{"type":"web_search"}]}',
        '{"input":"x","tool_choice":"required","tools":[{"type":"function","name":"g"}],"text":{"format":{"type":"json_schema","name":"n","schema":{"type":"object"}}}}',
        '{"input":[{"type":"reasoning"}]}', '{"input":[{"type":"function_call_output","call_id":"nope","output":"x"}]}',
    ]
    for i, b in enumerate(R): put("api", "responses-%d" % i, bytes([4, 255]) + b.encode())

# ---- json: texts
def json_():
    texts = {
        "object": '{"a":1,"b":[true,false,null],"c":{"d":"e"}}',
        "numbers": '[0,-0,1.5,-2e10,3E+2,4e-3,123456789012345678901234567890,0.000001]',
        "escapes": '["\\" \\\\ \\/ \\b \\f \\n \\r \\t","\\u0041\\u00e9\\u4e2d\\ud83d\\ude00"]',
        "utf8": '"caf\u00e9 \u4e2d\u6587 \U0001F600"',
        "ws": ' \t\r\n{ "k" : [ 1 , 2 ] } \n',
        "deep": "[" * 300 + "]" * 300,
        "deep-ok": '{"a":' * 100 + "1" + "}" * 100,
        "bad-escape": '"\\u12zz"', "nul": '"a\\u0000b"', "lone-high": '"\\ud83d"', "lone-low": '"\\ude00"',
        "raw-ctl": '"a\tb"', "leading-zero": "01", "trailing": '{"a":1} x', "trunc": '{"a":[1,2',
        "long-number": "1" * 70, "literal": "tru", "empty": "",
    }
    for name, t in texts.items():
        put("json", name, t)
    put("json", "bad-utf8", b'"\xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf"')

# ---- gguf: files written to the format
def gguf_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b

def gguf_kv(key, typ, val):
    out = gguf_str(key) + struct.pack("<I", typ)
    if typ == 4: out += struct.pack("<I", val)
    elif typ == 5: out += struct.pack("<i", val)
    elif typ == 6: out += struct.pack("<f", val)
    elif typ == 7: out += struct.pack("<?", val)
    elif typ == 8: out += gguf_str(val)
    elif typ == 9:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            if et == 8: out += gguf_str(it)
            elif et == 6: out += struct.pack("<f", it)
            elif et == 5: out += struct.pack("<i", it)
    return out

def gguf_file(kvs, tensors, align=32):
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    body = b"".join(gguf_kv(*kv) for kv in kvs)
    infos, data, off = b"", b"", 0
    for name, dims, typ, raw in tensors:
        infos += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", typ, off)
        pad = (-len(raw)) % align
        data += raw + b"\0" * pad
        off += len(raw) + pad
    meta = head + body + infos
    meta += b"\0" * ((-len(meta)) % align)
    return meta + data

def gguf():
    spm_tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581", "\u2581a", "b", "ab", "\u2581hello", "lo"]
    spm = [("general.architecture", 8, "llama"), ("tokenizer.ggml.model", 8, "llama"),
           ("tokenizer.ggml.tokens", 9, (8, spm_tokens)),
           ("tokenizer.ggml.scores", 9, (6, [0.0] * 3 + [0.0] * 256 + [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0])),
           ("tokenizer.ggml.token_type", 9, (5, [2, 3, 3] + [6] * 256 + [1] * 6)),
           ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.eos_token_id", 4, 2),
           ("tokenizer.ggml.add_bos_token", 7, True)]
    f32 = struct.pack("<8f", *[0.5 * i for i in range(8)])
    q8 = struct.pack("<e", 0.25) + bytes(range(32))
    t = [("token_embd.weight", [4, 2], 0, f32), ("blk.0.attn_q.weight", [32, 1], 8, q8)]
    put("gguf", "spm-vocab", gguf_file(spm, t))
    bytes_cp = [chr(c) for c in list(range(0x21, 0x7f)) + list(range(0xa1, 0xad)) + list(range(0xae, 0x100))]
    n = 0
    for b in range(256):
        if chr(b) not in bytes_cp: bytes_cp.append(chr(256 + n)); n += 1
    bpe_tokens = bytes_cp[:256] + ["\u0120a", "ab", "<|endoftext|>"]
    bpe = [("tokenizer.ggml.model", 8, "gpt2"), ("tokenizer.ggml.pre", 8, "gpt-2"),
           ("tokenizer.ggml.tokens", 9, (8, bpe_tokens)),
           ("tokenizer.ggml.token_type", 9, (5, [1] * 258 + [3])),
           ("tokenizer.ggml.merges", 9, (8, ["\u0120 a", "a b"])),
           ("tokenizer.ggml.eos_token_id", 4, 258), ("general.alignment", 4, 64)]
    put("gguf", "bpe-vocab", gguf_file(bpe, [], align=64))
    put("gguf", "header-only", b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    put("gguf", "v2-scalars", b"GGUF" + struct.pack("<IQQ", 2, 0, 3) + gguf_kv("a.u32", 4, 7) + gguf_kv("b.f32", 6, 1.5)
        + gguf_kv("c.str", 8, "x"))
    kvserve = sys.argv[1] if len(sys.argv) > 1 else "build/kvserve"
    if os.path.exists(kvserve):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "tiny.gguf")
            subprocess.run([kvserve, "mkmodel", "-o", p, "--preset", "tiny"], check=True, capture_output=True)
            data = open(p, "rb").read()
            for n in (24, 512, 4096, 16384):
                put("gguf", "mkmodel-tiny-prefix-%d" % n, data[:n])
    else:
        print("seed-corpus: %s not found: no mkmodel prefixes" % kvserve)

# ---- tokenizer: byte 0 = vocabulary index, byte 1 = mode (bits 0-1: 2 decode; bit 2 add_special, bit 3 parse_special)
def tokenizer():
    texts = ["Hello world", " leading and  double  spaces\n\ttabs", "caf\u00e9 na\u00efve \u4e2d\u6587 \U0001F600\U0001F44D",
             "<s>[INST] hi [/INST]</s> <|im_start|>user\nhi<|im_end|> <|endoftext|>", "123 4567 89.0 1e9", "def f(x):\n    return x**2\n",
             "\u2581\u2581 already escaped", "'s 've 're n't I'm"]
    for v in range(6):
        for i, t in enumerate(texts):
            put("tokenizer", "v%d-text%d" % (v, i), bytes([v, 0 if i % 2 else 12]) + t.encode())
        put("tokenizer", "v%d-bytes" % v, bytes([v, 8]) + bytes([0xff, 0xfe, 0xc3, 0x28, 0xe2, 0x82, 0x00, 0x41, 0xf0, 0x9f, 0x98]))
        rnd = random.Random(v)
        ids = b"".join(struct.pack("<H", rnd.randrange(0, 65536)) for _ in range(24))
        put("tokenizer", "v%d-decode" % v, bytes([v, 2]) + ids)
        put("tokenizer", "v%d-decode-end" % v, bytes([v, 2]) + b"".join(struct.pack("<H", 0xFFF0 + k) for k in range(16)))

# ---- kv_cache: 8 configuration bytes, then choices
def kv_cache():
    rnd = random.Random(14)
    cfgs = [bytes([0, 3, 40, 7, 20, 0, 0, 1]), bytes([0, 0, 10, 9, 12, 0, 0, 1]), bytes([6, 7, 30, 5, 30, 0, 0, 1]),
            bytes([7, 3, 20, 5, 12, 0, 0, 1]), bytes([1, 3, 40, 7, 20, 0, 200, 1]), bytes([2, 1, 40, 7, 16, 200, 180, 1]),
            bytes([3, 3, 6, 3, 8, 0, 0, 1]), bytes([4, 7, 32, 7, 20, 0, 0, 0])]
    for i, c in enumerate(cfgs):
        for k, n in enumerate((64, 600)):
            put("kv_cache", "cfg%d-%d" % (i, n), c + bytes(rnd.randrange(256) for _ in range(n)))

# ---- kv_tier: damage to the first run's file, then to the session: each a u16 truncation length (0: none) and up
# to 8 edits of (u16 offset, xor byte). The files: 0.kvt (6 blocks, 3384 bytes), the session (10 blocks, 5560 bytes).
def kv_tier():
    noop = struct.pack("<H", 0) + struct.pack("<HB", 0, 0) * 8
    put("kv_tier", "intact", b"")
    for cut in (1, 100, 119, 120, 151, 400, 3383):
        put("kv_tier", "cut-run-%d" % cut, struct.pack("<H", cut))
        put("kv_tier", "cut-session-%d" % cut, noop + struct.pack("<H", cut))
    for off in (0, 9, 20, 52, 100, 112, 118, 125, 140, 300, 700, 1500, 3383):
        put("kv_tier", "flip-run-%d" % off, struct.pack("<HHB", 0, off, 0x10))
        put("kv_tier", "flip-session-%d" % off, noop + struct.pack("<HHB", 0, off, 0x80))
    rnd = random.Random(29)
    for i in range(6):
        put("kv_tier", "random-%d" % i, bytes(rnd.randrange(256) for _ in range(60)))

# ---- template: byte 0 = options (bit 0 mark content, bits 1-2 limits), bytes 1-2 = template length (LE), the
# template, then the variables (a JSON object, else lines that become a conversation). The templates are written
# here for the fuzzer (chat-like ones in the styles models use, and hostile ones), none copied from a model.
def template():
    conv = json.dumps({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi <|im_end|> there"},
        {"role": "assistant", "content": "Hello!", "tool_calls": [
            {"type": "function", "function": {"name": "get", "arguments": {"city": "Paris", "n": 2}}}]},
        {"role": "tool", "content": "{\"t\": 21.5}"},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "two"}]}],
        "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
        "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"})
    lines = "sys:You are terse.\nfirst question\nan answer\nsecond question"
    chat = {
        "im": "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] if m['content'] is string else m['content'] | map(attribute='text') | join('')) + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        "header": "{{- bos_token }}{%- for m in messages %}{{- '<|hdr|>' ~ m.role ~ '<|/hdr|>\\n\\n' }}{%- if m.content is string %}{{- m.content | trim }}{%- else %}{%- for p in m.content %}{{ p.text }}{% endfor %}{%- endif %}{{- '<|eot|>' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|hdr|>assistant<|/hdr|>\\n\\n' }}{%- endif %}",
        "inst": "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate user/assistant') }}{% endif %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}",
        "tools": "{%- set ns = namespace(sys='', n=0) %}{%- if tools %}{{ 'Tools: ' ~ tools | tojson }}{%- endif %}{%- for m in messages %}{%- if m.role == 'system' %}{%- set ns.sys = m.content %}{%- continue %}{%- endif %}{%- set ns.n = ns.n + 1 %}{{ ns.n }}:{{ m.role | upper }}: {{ m.content if m.content is string else m.content | tojson }}{%- if m.tool_calls %}{%- for c in m.tool_calls %} call {{ c.function.name }}({{ c.function.arguments | tojson }}){%- endfor %}{%- endif %}\n{%- endfor %}[{{ ns.sys }}] {{ strftime_now('%Y-%m-%d %A') }}",
        "macro": "{% macro turn(role, text, end='\\n') -%}<{{ role }}>{{ text }}</{{ role }}>{{ end }}{%- endmacro %}{% for m in messages %}{{ turn(m.role, m.content if m.content is string else 'parts', end=';') }}{% if loop.last %}{% break %}{% endif %}{% endfor %}",
        "call": "{% macro box(w) %}[{{ caller() | center(w) }}]{% endmacro %}{% call box(20) %}{{ messages | length }} msgs{% endcall %}{% filter upper %}{{ messages[0].content[:5] }}{% endfilter %}{% set x %}{{ messages | selectattr('role', 'equalto', 'user') | list | length }}{% endset %}{{ x }}",
        "values": "{{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ [1, 'a', none, true] }} {{ {'k': [1.5]} }} {{ 'abc'[::-1] }} {{ range(3) | list }} {{ 'a,b' .split(',') }} {{ dict(a=1).items() | list }} {{ '%s-%d' % ('x', 3) }} {{ 'x' if undefined_thing is defined else 'y' }}",
        "ws": "  {%- if true -%}  a  {%+ if 1 %} b {% endif -%}\n  {# comment #}\n{%- raw %}{{ not evaluated }}{% endraw %}{% generation %}gen{% endgeneration %}",
    }
    hostile = {
        "deep-recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "mutual-recursion": "{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(1) }}",
        "huge-loop": "{% for i in range(1000000000) %}{% for j in range(1000000000) %}{% endfor %}{% endfor %}",
        "huge-output": "{% for i in range(100000000) %}xxxxxxxxxxxxxxxx{% endfor %}",
        "string-doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}",
        "list-doubling": "{% set ns = namespace(l=[1, 2]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
        "repeat-mul": "{{ 'x' * 1000000000 }}{{ [0] * 1000000000 }}",
        "deep-parens": "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",
        "deep-blocks": "{% if 1 %}" * 600 + "x" + "{% endif %}" * 600,
        "deep-list": "{{ " + "[" * 2000 + "]" * 2000 + " }}",
        "self-nesting": "{% set ns = namespace(d={}) %}{% for i in range(200) %}{% set ns.d = {'k': ns.d} %}{% endfor %}{{ ns.d | tojson }}",
        "caller-escape": "{% macro keep() %}{% set ns.c = caller %}{% endmacro %}{% set ns = namespace(c=none) %}{% call keep() %}x{% endcall %}{{ ns.c() }}",
        "big-int": "{{ 9223372036854775807 + 1 }}{{ 2 ** 200 }}{{ -9223372036854775807 - 2 }}",
        "unsupported": "{% include 'x' %}{% for x in y recursive %}{% endfor %}",
        "unclosed": "{% for m in messages %}{{ m.content ",
        "bad-filter": "{{ messages | no_such_filter }}{{ messages.no_such_method() }}",
        "zero-div": "{{ 1 // 0 }}",
        "nul-bytes": "a\x00{{ 'b\x00c' }}\x00{% if true %}d{% endif %}",
    }
    def enc(opt, src, rest):
        t = src.encode("utf-8", "surrogatepass")
        return bytes([opt]) + struct.pack("<H", len(t)) + t + rest.encode()
    for name, src in chat.items():
        put("template", "chat-" + name, enc(1, src, conv))
        put("template", "chat-" + name + "-lines", enc(0, src, lines))
    for i, (name, src) in enumerate(hostile.items()):
        put("template", "hostile-" + name, enc(i % 4 * 2, src, conv))
        put("template", "hostile-" + name + "-default", enc(0, src, conv))

if __name__ == "__main__":
    http(); api(); json_(); gguf(); tokenizer(); kv_cache(); template(); kv_tier()
    for h in sorted(os.listdir(ROOT)):
        print("%-10s %3d files" % (h, len(os.listdir(os.path.join(ROOT, h)))))

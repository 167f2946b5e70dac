/*
 * mkmodel_oss.c: what `kvserve mkmodel --arch gpt-oss` adds to cmd_mkmodel.c (see mkmodel.h): the harmony special
 * tokens of its built-in vocabulary, its chat template, its metadata keys and its layer's tensors (the names and
 * shapes llama.cpp v0.5.0 loads for general.architecture "gpt-oss").
 *
 * The template is written here from the published facts of the harmony format: messages
 * "<|start|>ROLE<|message|>TEXT<|end|>", the assistant's on a channel ("<|channel|>analysis|final|commentary"), a
 * system message carrying "Reasoning: low|medium|high" (from reasoning_effort), the system prompt and the tools
 * (as TypeScript-like declarations in a `functions` namespace) in a developer message, tool calls as commentary
 * messages "to=functions.NAME" ending in "<|call|>", their results from "functions.NAME to=assistant".
 */
#include <stdio.h>
#include <string.h>

#include "tools/mkmodel.h"

bool kvs_mk_is_oss(const mk_opts *o) { return !strcmp(o->arch, "gpt-oss"); }

/* ids 0..9 of the built-in vocabulary for gpt-oss: <|return|> is the end of a turn (eos), <|call|> ends a tool
 * call; <|end|> ends a message and generation goes on (harmony: the vocabulary has <|return|> and <|call|>). */
static const char *const k_oss_specials[] = {"<unk>", "<|startoftext|>", "<|return|>", "<|start|>", "<|end|>",
                                             "<|message|>", "<|channel|>", "<|call|>", "<|constrain|>",
                                             "<|endoftext|>"};

const char *const *kvs_mk_oss_specials(size_t *n) {
    *n = sizeof k_oss_specials / sizeof k_oss_specials[0];
    return k_oss_specials;
}

/* A JSON Schema property as a TypeScript type, one level deep (arrays of a simple type, enums of strings). */
#define OSS_TS_TYPE(P)                                                                                             \
    "{%- if " P ".enum is defined -%}{%- for v in " P ".enum -%}\"{{ v }}\"{%- if not loop.last %} | {% endif -%}" \
    "{%- endfor -%}{%- elif " P ".type is defined and " P ".type == 'string' -%}string"                           \
    "{%- elif " P ".type is defined and " P ".type in ['integer', 'number'] -%}number"                            \
    "{%- elif " P ".type is defined and " P ".type == 'boolean' -%}boolean"                                       \
    "{%- elif " P ".type is defined and " P ".type == 'array' -%}"                                                \
    "{%- if " P "['items'] is defined and " P "['items'].type is defined and " P "['items'].type in "             \
    "['string', 'boolean'] -%}{{ " P "['items'].type }}[]{%- elif " P "['items'] is defined and " P               \
    "['items'].type is defined and " P "['items'].type in ['integer', 'number'] -%}number[]{%- else -%}any[]"     \
    "{%- endif -%}{%- else -%}any{%- endif -%}"

static const char k_oss_template[] =
    "{#- harmony (gpt-oss), written for kvserve mkmodel -#}\n"
    "{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else 'medium' -%}\n"
    "{%- if messages and messages[0].role in ['system', 'developer'] -%}\n"
    "{%- set instructions = messages[0].content -%}{%- set rest = messages[1:] -%}\n"
    "{%- else -%}{%- set instructions = '' -%}{%- set rest = messages -%}{%- endif -%}\n"
    "<|start|>system<|message|>You are an assistant answering through channels.\n"
    "Knowledge cutoff: 2024-06\n\nReasoning: {{ effort }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "{%- if tools -%}{{ '\n' }}Calls to these tools must go to the commentary channel: 'functions'.{%- endif -%}"
    "<|end|>"
    "{%- if instructions or tools -%}<|start|>developer<|message|>"
    "{%- if instructions -%}# Instructions{{ '\n\n' }}{{ instructions }}{%- endif -%}"
    "{%- if tools -%}{%- if instructions -%}{{ '\n\n' }}{%- endif -%}"
    "# Tools{{ '\n\n' }}## functions{{ '\n\n' }}namespace functions {{ '{' }}{{ '\n' }}"
    "{%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}{{ '\n' }}"
    "{%- if f.description is defined and f.description -%}// {{ f.description }}{{ '\n' }}{%- endif -%}"
    "type {{ f.name }} = ("
    "{%- if f.parameters is defined and f.parameters.properties is defined and f.parameters.properties -%}"
    "_: {{ '{' }}{{ '\n' }}"
    "{%- for pname, p in f.parameters.properties.items() -%}"
    "{%- if p.description is defined and p.description -%}// {{ p.description }}{{ '\n' }}{%- endif -%}"
    "{{ pname }}{{ '' if f.parameters.required is defined and pname in f.parameters.required else '?' }}{{ ': ' }}"
    OSS_TS_TYPE("p") ",{{ '\n' }}"
    "{%- endfor -%}{{ '}' }}"
    "{%- endif -%}) => any;{{ '\n' }}"
    "{%- endfor -%}{{ '\n' }}} // namespace functions"
    "{%- endif -%}<|end|>"
    "{%- endif -%}\n"
    "{%- set ns = namespace(call='') -%}\n"
    "{%- for m in rest -%}\n"
    "{%- if m.role == 'user' -%}<|start|>user<|message|>{{ m.content }}<|end|>\n"
    "{%- elif m.role == 'assistant' -%}\n"
    "{%- if m.tool_calls -%}\n"
    "{%- if m.reasoning_content -%}"
    "<|start|>assistant<|channel|>analysis<|message|>{{ m.reasoning_content }}<|end|>{%- endif -%}\n"
    "{%- for c in m.tool_calls -%}{%- set fn = c.function if c.function is defined else c -%}"
    "{%- set ns.call = fn.name -%}"
    "<|start|>assistant<|channel|>commentary to=functions.{{ fn.name }} <|constrain|>json<|message|>"
    "{{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}<|call|>{%- endfor -%}\n"
    "{%- else -%}<|start|>assistant<|channel|>final<|message|>{{ m.content if m.content else '' }}<|end|>"
    "{%- endif -%}\n"
    "{%- elif m.role == 'tool' -%}"
    "<|start|>functions.{{ m.name if m.name is defined and m.name else ns.call }} to=assistant<|channel|>commentary"
    "<|message|>{{ m.content }}<|end|>\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}";

const char *kvs_mk_oss_template(void) { return k_oss_template; }

int kvs_mk_oss_metadata(eng_gguf_writer *w, const mk_opts *o) {
    char key[96];
    int rc = 0;
#define U32(k, v)                                                                                                 \
    do {                                                                                                           \
        if (!rc) {                                                                                                 \
            snprintf(key, sizeof key, "gpt-oss." k);                                                               \
            rc = eng_gguf_add_u32(w, key, (uint32_t)(v));                                                          \
        }                                                                                                          \
    } while (0)
    U32("expert_count", o->n_expert);
    U32("expert_used_count", o->n_expert_used);
    U32("expert_feed_forward_length", o->n_ff_exp);
    U32("attention.sliding_window", o->n_swa);
#undef U32
    return rc;
}

int kvs_mk_oss_layer(const mk_sink *sk, const mk_opts *o, int64_t l, size_t *total, int *count) {
    const int64_t E = o->n_embd, Q = o->n_head * o->head_dim, KV = o->n_head_kv * o->head_dim;
    const int64_t X = o->n_expert, FX = o->n_ff_exp;
    /* llama.cpp's gpt-oss layer; the router in f32, the experts stacked (3-D) in the matrices' type, biases f32 */
    const mk_tdef t[] = {
        {"attn_norm.weight", MK_NORM, E, 1, 1},         {"attn_q.weight", MK_MATRIX, E, Q, 1},
        {"attn_q.bias", MK_BIAS, Q, 1, 1},              {"attn_k.weight", MK_MATRIX, E, KV, 1},
        {"attn_k.bias", MK_BIAS, KV, 1, 1},             {"attn_v.weight", MK_MATRIX, E, KV, 1},
        {"attn_v.bias", MK_BIAS, KV, 1, 1},             {"attn_output.weight", MK_MATRIX, Q, E, 1},
        {"attn_output.bias", MK_BIAS, E, 1, 1},         {"attn_sinks.weight", MK_BIAS, o->n_head, 1, 1},
        {"post_attention_norm.weight", MK_NORM, E, 1, 1}, {"ffn_gate_inp.weight", MK_ROUTER, E, X, 1},
        {"ffn_gate_inp.bias", MK_BIAS, X, 1, 1},        {"ffn_gate_exps.weight", MK_MATRIX, E, FX, X},
        {"ffn_gate_exps.bias", MK_BIAS, FX, X, 1},      {"ffn_up_exps.weight", MK_MATRIX, E, FX, X},
        {"ffn_up_exps.bias", MK_BIAS, FX, X, 1},        {"ffn_down_exps.weight", MK_MATRIX, FX, E, X},
        {"ffn_down_exps.bias", MK_BIAS, E, X, 1},
    };
    char name[96];
    int rc = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0] && !rc; i++) {
        snprintf(name, sizeof name, "blk.%lld.%s", (long long)l, t[i].suffix);
        rc = kvs_mk_tensor_one(sk, o, name, t[i].kind, t[i].ne0, t[i].ne1, t[i].ne2, total, count);
    }
    return rc;
}

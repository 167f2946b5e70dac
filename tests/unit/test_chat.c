/*
 * test_chat.c: chat template detection and rendering (engine/text/chat.h eng_chat_render_text and the engine.h
 * family helpers). Expected strings are written from the documented formats (see engine/text/chat.c); with
 * ../shared present, the rendered prompts of llama.cpp in reference/<model>.chat.json are matched exactly using the
 * model's own template text (the shared-material tests are at the end of this file).
 */
#include <criterion/criterion.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/text/chat.h"
#include "engine/engine.h"
#include "engine/format/gguf.h"
#include "helper_shared.h"

#define M(r, c) { (r), (c) }

static char *render(const char *tmpl, const eng_chat_msg *m, size_t n, bool gen, eng_chat_family f, bool *fb) {
    char *out = NULL;
    int rc = eng_chat_render_text(tmpl, "<s>", "</s>", m, n, gen, f, &out, fb);
    cr_assert_eq(rc, ENG_OK, "render rc %d", rc);
    cr_assert_not_null(out);
    return out;
}

static void expect_render(const char *tmpl, const eng_chat_msg *m, size_t n, bool gen, eng_chat_family f,
                          const char *want) {
    bool fb = true;
    char *got = render(tmpl, m, n, gen, f, &fb);
    cr_assert_str_eq(got, want, "family %s gen %d:\n got: [%s]\nwant: [%s]", eng_chat_family_name(f), gen, got,
                     want);
    cr_assert(!fb, "no fallback expected for an explicit or recognized family");
    free(got);
}

/* The conversation used for every family: system, user, assistant, user. */
static const eng_chat_msg conv[] = {
    M("system", "You are terse."),
    M("user", "Hi"),
    M("assistant", "Hello!"),
    M("user", "Name a color."),
};
#define NCONV (sizeof(conv) / sizeof(conv[0]))

/* ---- names and detection ----------------------------------------------------------------------------------- */
Test(chat, family_names_round_trip) {
    const eng_chat_family all[] = { ENG_CHAT_CHATML, ENG_CHAT_LLAMA3, ENG_CHAT_LLAMA2, ENG_CHAT_MISTRAL,
                                    ENG_CHAT_PHI3, ENG_CHAT_ZEPHYR, ENG_CHAT_GEMMA };
    const char *names[] = { "chatml", "llama3", "llama2", "mistral", "phi3", "zephyr", "gemma" };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        cr_assert_str_eq(eng_chat_family_name(all[i]), names[i]);
        cr_assert_eq(eng_chat_family_from_name(names[i]), all[i]);
        cr_assert_eq(eng_chat_detect(names[i]), all[i], "a bare family name is accepted as a template");
    }
    cr_assert_eq(eng_chat_family_from_name("nope"), ENG_CHAT_AUTO);
    cr_assert_eq(eng_chat_family_from_name(NULL), ENG_CHAT_AUTO);
    cr_assert_eq(eng_chat_family_from_name("ChatML"), ENG_CHAT_AUTO, "names are case-sensitive");
    cr_assert_str_eq(eng_chat_family_name(ENG_CHAT_AUTO), "auto");
    cr_assert_str_eq(eng_chat_family_name((eng_chat_family)99), "unknown");
}

/* Template texts in the style of the real ones (markers as the model families use them). */
static const char t_qwen[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>"
    "assistant\n' }}{% endif %}";
static const char t_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
static const char t_llama3[] =
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>"
    "\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char t_llama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + messages[0]['content'] + "
    "'\\n<</SYS>>\\n\\n' %}{% endif %}{% for message in loop_messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + content + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ content + eos_token }}"
    "{% endif %}{% endfor %}";
static const char t_llama2_official[] =
    "{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
    "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% endif %}{% if message['role'] "
    "== 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
static const char t_mistral[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + "
    "eos_token}}{% endif %}{% endfor %}";
static const char t_phi3[] =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";
static const char t_phi3_mini[] = /* the original Phi-3-mini template: no system role, no generation prompt */
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
    "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') %}"
    "{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}";
static const char t_zephyr[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";
static const char t_gemma[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] "
    "| trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}";

Test(chat, detect_families) {
    cr_assert_eq(eng_chat_detect(t_qwen), ENG_CHAT_CHATML);
    cr_assert_eq(eng_chat_detect(t_chatml), ENG_CHAT_CHATML);
    cr_assert_eq(eng_chat_detect(t_llama3), ENG_CHAT_LLAMA3);
    cr_assert_eq(eng_chat_detect(t_llama2), ENG_CHAT_LLAMA2);
    cr_assert_eq(eng_chat_detect(t_llama2_official), ENG_CHAT_LLAMA2);
    cr_assert_eq(eng_chat_detect(t_mistral), ENG_CHAT_MISTRAL);
    cr_assert_eq(eng_chat_detect(t_phi3), ENG_CHAT_PHI3);
    cr_assert_eq(eng_chat_detect(t_phi3_mini), ENG_CHAT_PHI3);
    cr_assert_eq(eng_chat_detect(t_zephyr), ENG_CHAT_ZEPHYR);
    cr_assert_eq(eng_chat_detect(t_gemma), ENG_CHAT_GEMMA);
    cr_assert_eq(eng_chat_detect(NULL), ENG_CHAT_AUTO);
    cr_assert_eq(eng_chat_detect(""), ENG_CHAT_AUTO);
    cr_assert_eq(eng_chat_detect("{{ messages[0]['content'] }}"), ENG_CHAT_AUTO);
    cr_assert_eq(eng_chat_detect("<|im_start|>{{ role }}<|im_sep|>"), ENG_CHAT_AUTO, "Phi-4 is not ChatML");
}

/* ---- every family: system + multi-turn + generation prompt --------------------------------------------------- */
Test(chat, render_chatml) {
    const char *body = "<|im_start|>system\nYou are terse.<|im_end|>\n"
                       "<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\nHello!<|im_end|>\n"
                       "<|im_start|>user\nName a color.<|im_end|>\n";
    char want[512];
    snprintf(want, sizeof(want), "%s<|im_start|>assistant\n", body);
    expect_render(NULL, conv, NCONV, true, ENG_CHAT_CHATML, want);
    expect_render(NULL, conv, NCONV, false, ENG_CHAT_CHATML, body);
    expect_render(t_chatml, conv, NCONV, true, ENG_CHAT_AUTO, want);
    /* no default system prompt for a plain ChatML template */
    expect_render(t_chatml, conv + 1, 1, true, ENG_CHAT_AUTO, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

Test(chat, render_chatml_default_system) {
    const char *sys = "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n";
    char want[512];
    /* no system message: the template's default is inserted */
    snprintf(want, sizeof(want), "%s<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", sys);
    expect_render(t_qwen, conv + 1, 1, true, ENG_CHAT_AUTO, want);
    expect_render(t_qwen, conv + 1, 1, true, ENG_CHAT_CHATML, want);
    /* a system message first: it replaces the default */
    expect_render(t_qwen, conv, 2, true, ENG_CHAT_AUTO,
                  "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\n");
    /* a system message later on does not: the default comes first, the later one is an ordinary message */
    const eng_chat_msg late[] = { M("user", "Hi"), M("system", "Be brief.") };
    snprintf(want, sizeof(want), "%s<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\nBe brief.<|im_end|>\n", sys);
    expect_render(t_qwen, late, 2, false, ENG_CHAT_AUTO, want);
    /* Jinja-escaped form (backslash-n inside the string literal), Qwen2.5 style, with an escaped quote */
    const char *t25 = "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content']"
                      " + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba "
                      "Cloud. You\\'re a helpful assistant.<|im_end|>\\n' }}{%- endif %}";
    expect_render(t25, conv + 1, 1, false, ENG_CHAT_AUTO,
                  "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You're a helpful assistant."
                  "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

Test(chat, render_llama3) {
    const char *body = "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nName a color.<|eot_id|>";
    char want[1024];
    snprintf(want, sizeof(want), "%s<|start_header_id|>assistant<|end_header_id|>\n\n", body);
    expect_render(NULL, conv, NCONV, true, ENG_CHAT_LLAMA3, want);
    expect_render(t_llama3, conv, NCONV, true, ENG_CHAT_AUTO, want);
    expect_render(t_llama3, conv, NCONV, false, ENG_CHAT_AUTO, body);
    /* content is trimmed, the BOS text is never emitted */
    const eng_chat_msg sp[] = { M("user", "  \n padded \t\n") };
    expect_render(t_llama3, sp, 1, false, ENG_CHAT_AUTO, "<|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|>");
}

Test(chat, render_llama2) {
    const char *want = "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Name a color. [/INST]";
    expect_render(NULL, conv, NCONV, true, ENG_CHAT_LLAMA2, want);
    expect_render(t_llama2, conv, NCONV, true, ENG_CHAT_AUTO, want);
    expect_render(t_llama2, conv, NCONV, false, ENG_CHAT_AUTO, want); /* no generation prompt in this format */
    /* the official Llama-2-chat template ("content.strip()"): stripped content */
    const eng_chat_msg sp[] = { M("system", " S "), M("user", " Hi "), M("assistant", " Hello! "), M("user", "Q ") };
    expect_render(t_llama2_official, sp, 4, true, ENG_CHAT_AUTO,
                  "[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST]Hello!</s>[INST] Q [/INST]");
    /* BOS inside history ("bos_token + '[INST]" without stripping): later turns open with the BOS text */
    const char *t_bos = "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + "
                        "message['content'] + ' [/INST]' }}{% elif message['role'] == 'system' %}{{ '<<SYS>>\\n' + "
                        "message['content'] + '\\n<</SYS>>\\n\\n' }}{% else %}{{ message['content'] + eos_token }}"
                        "{% endif %}{% endfor %}";
    cr_assert_eq(eng_chat_detect(t_bos), ENG_CHAT_LLAMA2);
    expect_render(t_bos, sp, 4, true, ENG_CHAT_AUTO,
                  "[INST] <<SYS>>\n S \n<</SYS>>\n\n Hi  [/INST] Hello! </s><s>[INST] Q  [/INST]");
    /* a conversation ending with the assistant ends with its EOS */
    expect_render(NULL, conv + 1, 2, true, ENG_CHAT_LLAMA2, "[INST] Hi [/INST]Hello!</s>");
}

Test(chat, render_mistral) {
    const char *want = "[INST] You are terse.\nHi [/INST]Hello!</s>[INST] Name a color. [/INST]";
    expect_render(NULL, conv, NCONV, true, ENG_CHAT_MISTRAL, want);
    expect_render(t_mistral, conv, NCONV, true, ENG_CHAT_AUTO, want);
    expect_render(t_mistral, conv + 1, 3, true, ENG_CHAT_AUTO, "[INST] Hi [/INST]Hello!</s>[INST] Name a color. [/INST]");
}

Test(chat, render_phi3) {
    const char *body = "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
                       "<|user|>\nName a color.<|end|>\n";
    char want[512];
    snprintf(want, sizeof(want), "%s<|assistant|>\n", body);
    expect_render(NULL, conv, NCONV, true, ENG_CHAT_PHI3, want);
    expect_render(t_phi3, conv, NCONV, true, ENG_CHAT_AUTO, want);
    expect_render(t_phi3, conv, NCONV, false, ENG_CHAT_AUTO, body);
}

/* The original Phi-3-mini template (no system role; "<|assistant|>\n" follows each user message), with the
 * system message merged into the first user message ("{system}\n{user}") as llama.cpp's Jinja mode does. */
Test(chat, render_phi3_mini_variant) {
    const char *want = "<|user|>\nYou are terse.\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
                       "<|user|>\nName a color.<|end|>\n<|assistant|>\n";
    expect_render(t_phi3_mini, conv, NCONV, true, ENG_CHAT_AUTO, want);
    expect_render(t_phi3_mini, conv, NCONV, false, ENG_CHAT_AUTO, want); /* the template has no switch */
    /* two system messages joined by "\n"; an empty user message takes the system text alone */
    const eng_chat_msg two[] = { M("system", "A"), M("system", "B"), M("user", "") };
    expect_render(t_phi3_mini, two, 3, true, ENG_CHAT_AUTO, "<|user|>\nA\nB<|end|>\n<|assistant|>\n");
    /* a system message not followed by a user message becomes a user message */
    const eng_chat_msg lone[] = { M("user", "Hi"), M("assistant", "Yo"), M("system", "S") };
    expect_render(t_phi3_mini, lone, 3, true, ENG_CHAT_AUTO,
                  "<|user|>\nHi<|end|>\n<|assistant|>\nYo<|end|>\n<|user|>\nS<|end|>\n<|assistant|>\n");
    /* roles the template does not know render nothing */
    const eng_chat_msg tool[] = { M("user", "Hi"), M("tool", "42") };
    expect_render(t_phi3_mini, tool, 2, true, ENG_CHAT_AUTO, "<|user|>\nHi<|end|>\n<|assistant|>\n");
}

Test(chat, render_zephyr) {
    const char *body = "<|system|>\nYou are terse.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
                       "<|user|>\nName a color.</s>\n";
    char want[512];
    snprintf(want, sizeof(want), "%s<|assistant|>\n", body);
    expect_render(NULL, conv, NCONV, true, ENG_CHAT_ZEPHYR, want);
    expect_render(t_zephyr, conv, NCONV, true, ENG_CHAT_AUTO, want);
    expect_render(t_zephyr, conv, NCONV, false, ENG_CHAT_AUTO, body);
    /* a template written with <|endoftext|> (StableLM-Zephyr) ends turns with it */
    const char *t_end = "{% for message in messages %}{% if message['role'] == 'user' %}{{'<|user|>\n' + "
                        "message['content'] + '<|endoftext|>' + '\n'}}{% elif message['role'] == 'assistant' %}"
                        "{{'<|assistant|>\n' + message['content'] + '<|endoftext|>' + '\n'}}{% endif %}{% endfor %}"
                        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";
    cr_assert_eq(eng_chat_detect(t_end), ENG_CHAT_ZEPHYR);
    expect_render(t_end, conv + 1, 1, true, ENG_CHAT_AUTO, "<|user|>\nHi<|endoftext|>\n<|assistant|>\n");
    /* the EOS text of the model is used when given */
    char *out = NULL;
    cr_assert_eq(eng_chat_render_text(t_zephyr, "", "<eos>", conv + 1, 1, false, ENG_CHAT_AUTO, &out, NULL), ENG_OK);
    cr_assert_str_eq(out, "<|user|>\nHi<eos>\n");
    free(out);
}

Test(chat, render_gemma) {
    const char *body = "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n"
                       "<start_of_turn>model\nHello!<end_of_turn>\n"
                       "<start_of_turn>user\nName a color.<end_of_turn>\n";
    char want[512];
    snprintf(want, sizeof(want), "%s<start_of_turn>model\n", body);
    expect_render(NULL, conv, NCONV, true, ENG_CHAT_GEMMA, want);
    expect_render(t_gemma, conv, NCONV, true, ENG_CHAT_AUTO, want);
    expect_render(t_gemma, conv, NCONV, false, ENG_CHAT_AUTO, body);
    const eng_chat_msg sp[] = { M("user", "  hi  ") };
    expect_render(t_gemma, sp, 1, false, ENG_CHAT_AUTO, "<start_of_turn>user\nhi<end_of_turn>\n");
}

/* ---- fallback, validation, size ------------------------------------------------------------------------------ */
Test(chat, unknown_template_falls_back_to_chatml) {
    const char *want = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    const char *tmpls[] = { NULL, "", "{{ messages }} ### Human:" };
    for (size_t i = 0; i < 3; i++) {
        bool fb = false;
        char *out = render(tmpls[i], conv + 1, 1, true, ENG_CHAT_AUTO, &fb);
        cr_assert(fb, "template %zu: used_fallback not set", i);
        cr_assert_str_eq(out, want);
        free(out);
        /* an explicit family is not a fallback */
        out = render(tmpls[i], conv + 1, 1, true, ENG_CHAT_CHATML, &fb);
        cr_assert(!fb);
        free(out);
    }
    /* an explicit family overrides the template's */
    expect_render(t_llama3, conv + 1, 1, true, ENG_CHAT_CHATML, want);
}

Test(chat, validation) {
    char *out = (char *)1;
    bool fb = true;
    const eng_chat_msg no_role[] = { M("user", "a"), M(NULL, "b") };
    const eng_chat_msg no_content[] = { M("user", NULL) };
    cr_assert_eq(eng_chat_render_text(NULL, NULL, NULL, no_role, 2, true, ENG_CHAT_AUTO, &out, &fb), ENG_ERR_INVALID);
    cr_assert_null(out);
    cr_assert_eq(eng_chat_render_text(NULL, NULL, NULL, no_content, 1, true, ENG_CHAT_GEMMA, &out, &fb),
                 ENG_ERR_INVALID);
    cr_assert_eq(eng_chat_render_text(NULL, NULL, NULL, conv, 0, true, ENG_CHAT_AUTO, &out, &fb), ENG_ERR_INVALID);
    cr_assert_eq(eng_chat_render_text(NULL, NULL, NULL, NULL, 1, true, ENG_CHAT_AUTO, &out, &fb), ENG_ERR_INVALID);
    cr_assert_eq(eng_chat_render_text(NULL, NULL, NULL, conv, 1, true, ENG_CHAT_AUTO, NULL, &fb), ENG_ERR_INVALID);
    cr_assert_eq(eng_chat_render_text(NULL, NULL, NULL, conv, 1, true, (eng_chat_family)42, &out, &fb),
                 ENG_ERR_INVALID);
    cr_assert_eq(eng_chat_render_text(NULL, NULL, NULL, conv, 1, true, (eng_chat_family)-1, &out, &fb),
                 ENG_ERR_INVALID);
    /* NULL bos/eos and NULL used_fallback are fine */
    cr_assert_eq(eng_chat_render_text(NULL, NULL, NULL, conv, 1, true, ENG_CHAT_LLAMA2, &out, NULL), ENG_OK);
    cr_assert_str_eq(out, "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\n");
    free(out);
}

Test(chat, huge_content) {
    const size_t n = 16u << 20;
    char *big = malloc(n + 1);
    cr_assert_not_null(big);
    for (size_t i = 0; i < n; i++) big[i] = (char)('a' + i % 26);
    big[n] = '\0';
    const eng_chat_family fams[] = { ENG_CHAT_CHATML, ENG_CHAT_LLAMA3, ENG_CHAT_LLAMA2, ENG_CHAT_MISTRAL,
                                     ENG_CHAT_PHI3, ENG_CHAT_ZEPHYR, ENG_CHAT_GEMMA };
    for (size_t f = 0; f < sizeof(fams) / sizeof(fams[0]); f++) {
        const eng_chat_msg m[] = { M("user", big), M("assistant", "ok"), M("user", big) };
        char *out = render(NULL, m, 3, true, fams[f], NULL);
        size_t len = strlen(out);
        cr_assert_gt(len, 2 * n);
        cr_assert_lt(len, 2 * n + 400, "%s: length %zu", eng_chat_family_name(fams[f]), len);
        char *hit = strstr(out, "abcdefghijklmnopqrstuvwxyzabc");
        cr_assert_not_null(hit);
        cr_assert_eq(memcmp(hit, big, n), 0, "%s: content altered", eng_chat_family_name(fams[f]));
        free(out);
    }
    free(big);
}

/* Randomized: conversations of random roles and contents through the per-message families, against the
 * format written out directly with snprintf. */
typedef struct { uint64_t s; } trng;
static uint64_t trng_next(trng *r) {
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = r->s ^ (r->s >> 29);
    return x * 0xbf58476d1ce4e5b9ull ^ (x >> 31);
}

Test(chat, randomized_per_message_families) {
    static const char *roles[] = { "system", "user", "assistant", "tool" };
    static const char alphabet[] = "ab <|>\n\t{}'\"\\xyz";
    char contents[8][40];
    eng_chat_msg m[8];
    for (uint64_t seed = 1; seed <= 300; seed++) {
        trng r = { seed };
        size_t n = 1 + trng_next(&r) % 8;
        for (size_t i = 0; i < n; i++) {
            size_t len = trng_next(&r) % 39;
            for (size_t k = 0; k < len; k++) contents[i][k] = alphabet[trng_next(&r) % (sizeof(alphabet) - 1)];
            contents[i][len] = '\0';
            m[i].role = roles[trng_next(&r) % 4];
            m[i].content = contents[i];
        }
        bool gen = trng_next(&r) & 1;
        for (int fam = 0; fam < 3; fam++) {
            char want[2048];
            size_t w = 0;
            for (size_t i = 0; i < n; i++) {
                if (fam == 0) w += (size_t)snprintf(want + w, sizeof(want) - w, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
                if (fam == 1) w += (size_t)snprintf(want + w, sizeof(want) - w, "<|%s|>\n%s<|end|>\n", m[i].role, m[i].content);
                if (fam == 2) w += (size_t)snprintf(want + w, sizeof(want) - w, "<|%s|>\n%s</s>\n", m[i].role, m[i].content);
            }
            if (gen) snprintf(want + w, sizeof(want) - w, "%s", fam == 0 ? "<|im_start|>assistant\n" : "<|assistant|>\n");
            const eng_chat_family f = fam == 0 ? ENG_CHAT_CHATML : fam == 1 ? ENG_CHAT_PHI3 : ENG_CHAT_ZEPHYR;
            char *got = render(NULL, m, n, gen, f, NULL);
            cr_assert_str_eq(got, want, "seed %llu family %s", (unsigned long long)seed, eng_chat_family_name(f));
            free(got);
        }
    }
}

/* ---- with ../shared: the models' own templates ------------------------------------------------------------- */
static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Skips the test unless every shared file it needs is there (checked before anything is allocated). */
static void need(const char *const *rels, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", kvt_shared_dir(), rels[i]);
        if (!file_exists(path)) cr_skip_test("%s not present: shared test material unavailable", path);
    }
}

/* A model's tokenizer.chat_template (malloc'd, NUL-terminated; NULL when the file has none) and the texts of
 * its BOS / EOS tokens (from tokenizer.ggml.tokens; "" when absent). Skips the test when the file is absent. */
typedef struct model_text { char *tmpl; char bos[64]; char eos[64]; } model_text;

static void copy_str(char *dst, size_t cap, eng_gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

static model_text read_model(const char *rel) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", kvt_shared_dir(), rel);
    if (!file_exists(path)) cr_skip_test("%s not present: shared test models unavailable", path);
    eng_gguf *g = NULL;
    char err[512] = "";
    int rc = eng_gguf_open(path, &g, err, sizeof(err));
    cr_assert_eq(rc, ENG_OK, "%s", err);
    model_text mt = { 0 };
    eng_gguf_str t;
    if (eng_gguf_get_str(g, "tokenizer.chat_template", &t) == ENG_OK) {
        mt.tmpl = malloc((size_t)t.len + 1);
        cr_assert_not_null(mt.tmpl);
        memcpy(mt.tmpl, t.ptr, (size_t)t.len);
        mt.tmpl[t.len] = '\0';
    }
    uint32_t et;
    uint64_t n;
    const void *data;
    const eng_gguf_str *toks = NULL;
    if (eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &data, &toks) == ENG_OK && toks) {
        uint32_t id;
        if (eng_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &id) == ENG_OK && id < n)
            copy_str(mt.bos, sizeof(mt.bos), toks[id]);
        if (eng_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &id) == ENG_OK && id < n)
            copy_str(mt.eos, sizeof(mt.eos), toks[id]);
    }
    eng_gguf_close(g);
    return mt;
}

static cJSON *read_json(const char *rel) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", kvt_shared_dir(), rel);
    if (!file_exists(path)) cr_skip_test("%s not present: shared reference files unavailable", path);
    return kvt_read_json(path);
}

/* Renders each conversation of a .chat.json with the model's template (AUTO, generation prompt on, as
 * llama-server's chat completions do) and returns the results; expected[i] NULL: compare with the file's
 * rendered_prompt. */
static void check_conversations(const model_text *mt, const cJSON *cases, const char *const *expected,
                                eng_chat_family want_family) {
    cr_assert_eq(eng_chat_detect(mt->tmpl), want_family, "template detected as %s",
                 eng_chat_family_name(eng_chat_detect(mt->tmpl)));
    int i = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
        int n = cJSON_GetArraySize(msgs);
        cr_assert_gt(n, 0);
        eng_chat_msg *m = calloc((size_t)n, sizeof(*m));
        cr_assert_not_null(m);
        for (int k = 0; k < n; k++) {
            const cJSON *msg = cJSON_GetArrayItem(msgs, k);
            m[k].role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(msg, "role"));
            m[k].content = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(msg, "content"));
            cr_assert(m[k].role && m[k].content);
        }
        const char *want = expected ? expected[i]
                                    : cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "rendered_prompt"));
        cr_assert_not_null(want);
        char *out = NULL;
        bool fb = true;
        int rc = eng_chat_render_text(mt->tmpl, mt->bos, mt->eos, m, (size_t)n, true, ENG_CHAT_AUTO, &out, &fb);
        cr_assert_eq(rc, ENG_OK);
        cr_assert(!fb);
        cr_assert_str_eq(out, want, "conversation %d:\n got: [%s]\nwant: [%s]", i, out, want);
        free(out);
        free(m);
        i++;
    }
    cr_assert_eq(i, 3, "expected 3 conversations, got %d", i);
}

/* llama.cpp's rendered prompts for the Qwen2 chat model (its template inserts a default system prompt). */
Test(chat_shared, qwen2_reference_rendered_prompts) {
    const char *files[] = { "models/synthetic/syn-qwen2-chat-q8_0.gguf", "reference/syn-qwen2-chat-q8_0.chat.json" };
    need(files, 2);
    model_text mt = read_model("models/synthetic/syn-qwen2-chat-q8_0.gguf");
    cJSON *j = read_json("reference/syn-qwen2-chat-q8_0.chat.json");
    cr_assert_not_null(mt.tmpl, "the chat model has no tokenizer.chat_template");
    check_conversations(&mt, cJSON_GetObjectItemCaseSensitive(j, "cases"), NULL, ENG_CHAT_CHATML);
    cJSON_Delete(j);
    free(mt.tmpl);
}

/* The Phi-3 vocabulary's template (the original Phi-3-mini one: no system role, "<|assistant|>\n" after every
 * user message, bos_token first) on the same conversations. There is no llama.cpp rendering of it in
 * ../shared; the expected texts are what that template produces, with the system message merged into the
 * next user message as llama.cpp's Jinja mode does for templates without a system role, BOS not shown. */
Test(chat_shared, phi3_vocab_template) {
    const char *files[] = { "models/vocab-only/ggml-vocab-phi-3.gguf", "reference/syn-qwen2-chat-q8_0.chat.json" };
    need(files, 2);
    model_text mt = read_model("models/vocab-only/ggml-vocab-phi-3.gguf");
    cJSON *j = read_json("reference/syn-qwen2-chat-q8_0.chat.json");
    cr_assert_not_null(mt.tmpl, "ggml-vocab-phi-3.gguf has no tokenizer.chat_template");
    static const char *const want[3] = {
        "<|user|>\nHello!<|end|>\n<|assistant|>\n",
        "<|user|>\nYou are terse.\nName a color.<|end|>\n<|assistant|>\n",
        ("<|user|>\nHi<|end|>\n<|assistant|>\nHello, how can I help?<|end|>\n<|user|>\nTell me a story about a "
         "cat.<|end|>\n<|assistant|>\n"),
    };
    check_conversations(&mt, cJSON_GetObjectItemCaseSensitive(j, "cases"), want, ENG_CHAT_PHI3);
    cJSON_Delete(j);
    free(mt.tmpl);
}

/* Vocabularies without a template fall back to ChatML and say so. */
Test(chat_shared, no_template_falls_back) {
    const char *files[] = { "models/vocab-only/ggml-vocab-llama-spm.gguf", "models/synthetic/syn-llama-q8_0.gguf" };
    need(files, 2);
    for (size_t f = 0; f < 2; f++) {
        model_text mt = read_model(files[f]);
        cr_assert_null(mt.tmpl, "%s: unexpected template", files[f]);
        char *out = NULL;
        bool fb = false;
        cr_assert_eq(eng_chat_render_text(mt.tmpl, mt.bos, mt.eos, conv + 1, 1, true, ENG_CHAT_AUTO, &out, &fb),
                     ENG_OK);
        cr_assert(fb);
        cr_assert_str_eq(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        free(out);
    }
}

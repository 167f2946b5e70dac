/*
 * chat.c: chat template families (engine.h eng_chat_detect / _family_from_name / _family_name, chat.h
 * eng_chat_render_text). Templates are recognized by distinctive markers in their text, not executed.
 *
 * Formats ({r} role, {c} content, "gen" the generation prompt appended when add_generation_prompt):
 *   chatml   "<|im_start|>{r}\n{c}<|im_end|>\n" per message; gen "<|im_start|>assistant\n".
 *            Variant: a template that contains a literal "<|im_start|>system\n...<|im_end|>" (Qwen2's)
 *            inserts that default system message when the first message is not a system message.
 *   llama3   "<|start_header_id|>{r}<|end_header_id|>\n\n{trim(c)}<|eot_id|>"; gen
 *            "<|start_header_id|>assistant<|end_header_id|>\n\n". (The template's leading <|begin_of_text|> is
 *            the BOS, which the rendered text excludes.)
 *   llama2   "[INST] " opens a turn; system "<<SYS>>\n{c}\n<</SYS>>\n\n"; user "{c} [/INST]"; assistant
 *            "{c}{eos}" and closes the turn (the next message opens "[INST] " again). No generation prompt
 *            (the text already ends in "[/INST]"). Variants from the template text: "content.strip()" trims
 *            every content; otherwise "bos_token + '[INST]" opens later turns with "{bos}[INST] ". (The
 *            official Llama-2-chat template itself, run as Jinja, also puts spaces around assistant replies;
 *            like llama.cpp's built-in template, this renders its stripped variant.)
 *   mistral  llama2 without a system role: a system message becomes "{c}\n" inside the turn.
 *   phi3     "<|{r}|>\n{c}<|end|>\n"; gen "<|assistant|>\n". Variant: the original Phi-3-mini template
 *            (no "system" and no "add_generation_prompt" in its text) renders user "<|user|>\n{c}<|end|>\n
 *            <|assistant|>\n", assistant "{c}<|end|>\n", other roles nothing, and ignores
 *            add_generation_prompt; system messages are merged into the next user message as llama.cpp's
 *            --jinja mode does for templates without a system role ("{system}\n{user}"; several system
 *            messages joined by "\n"; one not followed by a user message becomes a user message itself).
 *   zephyr   "<|{r}|>\n{c}{end}\n"; gen "<|assistant|>\n". {end}: "<|endoftext|>" when the template text has
 *            it literally, else eos_text, else "</s>".
 *   gemma    "<start_of_turn>{r'}\n{trim(c)}<end_of_turn>\n" with r' = "model" for "assistant"; gen
 *            "<start_of_turn>model\n". System messages (trimmed, concatenated) are prepended to the next
 *            non-model turn as "{system}\n\n".
 * The formats are those of llama.cpp's built-in templates (llama-chat.cpp), the variants those of the model
 * templates named above.
 */
#include "engine/text/chat.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* ---- a growable string ------------------------------------------------------------------------------------- */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 2) { b->oom = true; return; }
            cap *= 2;
        }
        char *np = realloc(b->p, cap);
        if (!np) { b->oom = true; return; }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}
static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

/* The span of s without leading and trailing ASCII white space. */
static void trim_span(const char *s, const char **start, size_t *n) {
    size_t a = 0, e = strlen(s);
    while (a < e && isspace((unsigned char)s[a])) a++;
    while (e > a && isspace((unsigned char)s[e - 1])) e--;
    *start = s + a;
    *n = e - a;
}
static void sb_put_trimmed(sbuf *b, const char *s) {
    const char *t;
    size_t n;
    trim_span(s, &t, &n);
    sb_putn(b, t, n);
}

/* ---- families ---------------------------------------------------------------------------------------------- */
static const char *const family_names[] = {
    [ENG_CHAT_AUTO] = "auto",     [ENG_CHAT_CHATML] = "chatml", [ENG_CHAT_LLAMA3] = "llama3",
    [ENG_CHAT_LLAMA2] = "llama2", [ENG_CHAT_MISTRAL] = "mistral", [ENG_CHAT_PHI3] = "phi3",
    [ENG_CHAT_ZEPHYR] = "zephyr", [ENG_CHAT_GEMMA] = "gemma",
};
#define N_FAMILIES ((int)(sizeof(family_names) / sizeof(family_names[0])))

const char *eng_chat_family_name(eng_chat_family f) {
    if ((int)f < 0 || (int)f >= N_FAMILIES) return "unknown";
    return family_names[f];
}

eng_chat_family eng_chat_family_from_name(const char *name) {
    if (!name) return ENG_CHAT_AUTO;
    for (int i = 1; i < N_FAMILIES; i++) {
        if (strcmp(name, family_names[i]) == 0) return (eng_chat_family)i;
    }
    return ENG_CHAT_AUTO;
}

static bool has(const char *t, const char *needle) { return strstr(t, needle) != NULL; }

eng_chat_family eng_chat_detect(const char *t) {
    if (!t) return ENG_CHAT_AUTO;
    eng_chat_family named = eng_chat_family_from_name(t); /* a bare family name is accepted as a template */
    if (named != ENG_CHAT_AUTO) return named;
    if (has(t, "<|im_start|>")) {
        /* "<|im_sep|>" (Phi-4) and "<end_of_utterance>" (SmolVLM) reuse the marker with another format */
        if (has(t, "<|im_sep|>") || has(t, "<end_of_utterance>")) return ENG_CHAT_AUTO;
        return ENG_CHAT_CHATML;
    }
    if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>")) return ENG_CHAT_LLAMA3;
    if (has(t, "[INST]")) {
        /* newer Mistral formats ([SYSTEM_PROMPT], [AVAILABLE_TOOLS]) differ from both: not recognized */
        if (has(t, "[SYSTEM_PROMPT]") || has(t, "[AVAILABLE_TOOLS]")) return ENG_CHAT_AUTO;
        return has(t, "<<SYS>>") ? ENG_CHAT_LLAMA2 : ENG_CHAT_MISTRAL;
    }
    if ((has(t, "<|user|>") || has(t, "<|assistant|>")) && has(t, "<|end|>")) return ENG_CHAT_PHI3;
    if (has(t, "<|user|>") && (has(t, "eos_token") || has(t, "</s>") || has(t, "<|endoftext|>")))
        return ENG_CHAT_ZEPHYR;
    if (has(t, "<start_of_turn>")) return ENG_CHAT_GEMMA;
    return ENG_CHAT_AUTO;
}

/* ---- variants read from the template text ------------------------------------------------------------------ */
typedef struct variant {
    char *default_system;      /* chatml: malloc'd default system prompt, or NULL */
    bool llama2_bos_in_history;
    bool llama2_strip;
    bool phi3_no_system;       /* phi3: the template has no system role (merge system into user) */
    bool phi3_auto_assistant;  /* phi3: "<|assistant|>\n" follows every user message; no generation prompt */
    const char *zephyr_end;
} variant;

/* Finds a literal default system prompt: "<|im_start|>system" + newline (a real one or the two characters
 * backslash-n of a Jinja string) + text without Jinja syntax or quotes + "<|im_end|>". Unescapes the
 * Jinja string escapes \n \t \\ \' \". Returns ENG_OK with *out NULL when there is none. */
static int find_default_system(const char *t, char **out) {
    *out = NULL;
    static const char marker[] = "<|im_start|>system";
    const char *p = t;
    while ((p = strstr(p, marker)) != NULL) {
        p += sizeof(marker) - 1;
        const char *q = p;
        if (*q == '\n') q++;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end) return ENG_OK;
        bool ok = end > q;
        for (const char *c = q; c < end && ok; c++) {
            if (*c == '\'' || *c == '"' || *c == '{' || *c == '}' || *c == '+') ok = false;
            if (*c == '\\') c++; /* an escaped character */
        }
        if (!ok) continue;
        char *s = malloc((size_t)(end - q) + 1);
        if (!s) return ENG_ERR_NOMEM;
        size_t k = 0;
        for (const char *c = q; c < end; c++) {
            if (*c == '\\' && c + 1 < end) {
                c++;
                switch (*c) {
                case 'n': s[k++] = '\n'; break;
                case 't': s[k++] = '\t'; break;
                default: s[k++] = *c; break;
                }
            } else {
                s[k++] = *c;
            }
        }
        s[k] = '\0';
        *out = s;
        return ENG_OK;
    }
    return ENG_OK;
}

static int read_variant(const char *t, eng_chat_family f, const char *eos_text, variant *v) {
    memset(v, 0, sizeof(*v));
    v->zephyr_end = (eos_text && *eos_text) ? eos_text : "</s>";
    if (!t || eng_chat_detect(t) != f || eng_chat_family_from_name(t) == f) return ENG_OK; /* plain format */
    switch (f) {
    case ENG_CHAT_CHATML:
        return find_default_system(t, &v->default_system);
    case ENG_CHAT_LLAMA2:
    case ENG_CHAT_MISTRAL:
        /* as llama.cpp picks them: stripping wins over BOS inside history (they are not combined) */
        v->llama2_strip = has(t, "content.strip()");
        v->llama2_bos_in_history = !v->llama2_strip && has(t, "bos_token + '[INST]");
        return ENG_OK;
    case ENG_CHAT_PHI3:
        v->phi3_no_system = !has(t, "system");
        v->phi3_auto_assistant = !has(t, "add_generation_prompt") && has(t, "<|assistant|>");
        return ENG_OK;
    case ENG_CHAT_ZEPHYR:
        if (has(t, "<|endoftext|>")) v->zephyr_end = "<|endoftext|>";
        return ENG_OK;
    default:
        return ENG_OK;
    }
}

/* ---- renderers --------------------------------------------------------------------------------------------- */
/* One turn of the formats that wrap every message the same way: open, role, sep, content (trimmed when trim),
 * close. */
typedef struct turn_fmt { const char *open, *sep, *close; bool trim; } turn_fmt;
static const turn_fmt k_chatml = {"<|im_start|>", "\n", "<|im_end|>\n", false};
static const turn_fmt k_llama3 = {"<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>", true};
static const turn_fmt k_phi3 = {"<|", "|>\n", "<|end|>\n", false};

static void put_content(sbuf *b, const char *c, bool strip) {
    if (strip) sb_put_trimmed(b, c);
    else sb_puts(b, c);
}

static void put_turn(sbuf *b, const turn_fmt *f, const char *role, const char *content) {
    sb_puts(b, f->open);
    sb_puts(b, role);
    sb_puts(b, f->sep);
    put_content(b, content, f->trim);
    sb_puts(b, f->close);
}

static void render_turns(sbuf *b, const turn_fmt *f, const eng_chat_msg *m, size_t n) {
    for (size_t i = 0; i < n; i++) put_turn(b, f, m[i].role, m[i].content);
}

static void render_chatml(sbuf *b, const variant *v, const eng_chat_msg *m, size_t n, bool gen) {
    if (v->default_system && strcmp(m[0].role, "system") != 0) put_turn(b, &k_chatml, "system", v->default_system);
    render_turns(b, &k_chatml, m, n);
    if (gen) sb_puts(b, "<|im_start|>assistant\n");
}

static void render_llama3(sbuf *b, const eng_chat_msg *m, size_t n, bool gen) {
    render_turns(b, &k_llama3, m, n);
    if (gen) sb_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_llama2(sbuf *b, const variant *v, bool sys_role, const char *bos, const char *eos,
                          const eng_chat_msg *m, size_t n) {
    bool in_turn = true; /* the first turn's "[INST] " is written up front (its BOS is the sequence BOS) */
    sb_puts(b, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        if (!in_turn) {
            if (v->llama2_bos_in_history) sb_puts(b, bos);
            sb_puts(b, "[INST] ");
            in_turn = true;
        }
        if (strcmp(m[i].role, "system") == 0) {
            if (sys_role) {
                sb_puts(b, "<<SYS>>\n");
                put_content(b, m[i].content, v->llama2_strip);
                sb_puts(b, "\n<</SYS>>\n\n");
            } else {
                put_content(b, m[i].content, v->llama2_strip);
                sb_puts(b, "\n");
            }
        } else if (strcmp(m[i].role, "user") == 0) {
            put_content(b, m[i].content, v->llama2_strip);
            sb_puts(b, " [/INST]");
        } else {
            put_content(b, m[i].content, v->llama2_strip);
            sb_puts(b, eos);
            in_turn = false;
        }
    }
}

static void render_phi3(sbuf *b, const variant *v, const eng_chat_msg *m, size_t n, bool gen) {
    if (!v->phi3_no_system && !v->phi3_auto_assistant) {
        render_turns(b, &k_phi3, m, n);
        if (gen) sb_puts(b, "<|assistant|>\n");
        return;
    }
    /* the original Phi-3-mini template, with system messages merged into user messages first when it has no
     * system role. pending: the system text waiting for the next user message (as a span list: we write it
     * straight into the output when that message comes). */
    sbuf pending = { 0 };
    bool has_pending = false;
    for (size_t i = 0; i <= n; i++) {
        const char *role = i < n ? m[i].role : NULL;
        const char *content = i < n ? m[i].content : NULL;
        if (role && v->phi3_no_system && strcmp(role, "system") == 0) {
            if (*content) { /* an empty system message adds nothing */
                if (has_pending) sb_puts(&pending, "\n");
                sb_puts(&pending, content);
                has_pending = true;
            }
            continue;
        }
        bool is_user = role && strcmp(role, "user") == 0;
        if (has_pending && !is_user) { /* flush the system text as a user message of its own */
            sb_puts(b, "<|user|>\n");
            sb_putn(b, pending.p, pending.len);
            sb_puts(b, v->phi3_auto_assistant ? "<|end|>\n<|assistant|>\n" : "<|end|>\n");
            pending.len = 0;
            has_pending = false;
        }
        if (!role) break;
        if (is_user) {
            sb_puts(b, "<|user|>\n");
            if (has_pending) {
                sb_putn(b, pending.p, pending.len);
                if (*content) sb_puts(b, "\n");
                pending.len = 0;
                has_pending = false;
            }
            sb_puts(b, content);
            sb_puts(b, v->phi3_auto_assistant ? "<|end|>\n<|assistant|>\n" : "<|end|>\n");
        } else if (v->phi3_auto_assistant) {
            if (strcmp(role, "assistant") == 0) {
                sb_puts(b, content);
                sb_puts(b, "<|end|>\n");
            } /* other roles: the template renders nothing */
        } else {
            put_turn(b, &k_phi3, role, content);
        }
    }
    if (pending.oom) b->oom = true;
    free(pending.p);
    if (gen && !v->phi3_auto_assistant) sb_puts(b, "<|assistant|>\n");
}

static void render_zephyr(sbuf *b, const variant *v, const eng_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n; i++) {
        sb_puts(b, "<|");
        sb_puts(b, m[i].role);
        sb_puts(b, "|>\n");
        sb_puts(b, m[i].content);
        sb_puts(b, v->zephyr_end);
        sb_puts(b, "\n");
    }
    if (gen) sb_puts(b, "<|assistant|>\n");
}

static void render_gemma(sbuf *b, const eng_chat_msg *m, size_t n, bool gen) {
    sbuf sys = { 0 };
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "system") == 0) {
            const char *t;
            size_t len;
            trim_span(m[i].content, &t, &len);
            sb_putn(&sys, t, len);
            continue;
        }
        bool model = strcmp(m[i].role, "assistant") == 0;
        sb_puts(b, "<start_of_turn>");
        sb_puts(b, model ? "model" : m[i].role);
        sb_puts(b, "\n");
        if (!model && sys.len > 0) {
            sb_putn(b, sys.p, sys.len);
            sb_puts(b, "\n\n");
            sys.len = 0;
        }
        sb_put_trimmed(b, m[i].content);
        sb_puts(b, "<end_of_turn>\n");
    }
    if (sys.oom) b->oom = true;
    free(sys.p);
    if (gen) sb_puts(b, "<start_of_turn>model\n");
}

int eng_chat_render_text(const char *template_text, const char *bos_text, const char *eos_text,
                         const eng_chat_msg *msgs, size_t n, bool add_generation_prompt, eng_chat_family family,
                         char **out, bool *used_fallback) {
    if (out) *out = NULL;
    if (used_fallback) *used_fallback = false;
    if (!out || !msgs || n == 0 || (int)family < 0 || (int)family >= N_FAMILIES) return ENG_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) return ENG_ERR_INVALID;
    }
    if (family == ENG_CHAT_AUTO) {
        family = eng_chat_detect(template_text);
        if (family == ENG_CHAT_AUTO) {
            family = ENG_CHAT_CHATML;
            if (used_fallback) *used_fallback = true;
        }
    }
    variant v;
    int rc = read_variant(template_text, family, eos_text, &v);
    if (rc != ENG_OK) return rc;
    const char *bos = bos_text ? bos_text : "";
    const char *eos = (eos_text && *eos_text) ? eos_text : "</s>";

    sbuf b = { 0 };
    sb_puts(&b, ""); /* an empty result is still a string */
    switch (family) {
    case ENG_CHAT_CHATML: render_chatml(&b, &v, msgs, n, add_generation_prompt); break;
    case ENG_CHAT_LLAMA3: render_llama3(&b, msgs, n, add_generation_prompt); break;
    case ENG_CHAT_LLAMA2: render_llama2(&b, &v, true, bos, eos, msgs, n); break;
    case ENG_CHAT_MISTRAL: render_llama2(&b, &v, false, bos, eos, msgs, n); break;
    case ENG_CHAT_PHI3: render_phi3(&b, &v, msgs, n, add_generation_prompt); break;
    case ENG_CHAT_ZEPHYR: render_zephyr(&b, &v, msgs, n, add_generation_prompt); break;
    case ENG_CHAT_GEMMA: render_gemma(&b, msgs, n, add_generation_prompt); break;
    default: break;
    }
    free(v.default_system);
    if (b.oom) {
        free(b.p);
        return ENG_ERR_NOMEM;
    }
    *out = b.p;
    return ENG_OK;
}

/* test_reasoning.c: the streaming split of model output into reasoning and content (server/api/reasoning_internal.h):
 * <think> blocks against a plain whole-text reference on random texts cut into random pieces (markers split across
 * pieces, nested and stray markers, blocks left open at the end), gpt-oss harmony channels and tool calls, the
 * template detection and the format names. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "server/api/reasoning_internal.h"

typedef struct { char *reasoning, *content; } split;

static void split_free(split *s) { free(s->reasoning); free(s->content); }

/* Feeds text cut at random points (pieces of 0..max bytes; max 0: one piece), then finishes. */
static split run_pieces(srv_reasoning_syntax syn, bool open, const char *text, unsigned *seed, int max) {
    srv_reasoning p;
    srv_reasoning_init(&p, syn, open);
    kvs_buf r = {0}, c = {0};
    size_t n = strlen(text), at = 0;
    while (at < n) {
        size_t k = max ? (size_t)(rand_r(seed) % (unsigned)(max + 1)) : n;
        if (k > n - at) k = n - at;
        cr_assert_eq(srv_reasoning_feed(&p, text + at, k, &r, &c), 0);
        at += k;
    }
    cr_assert_eq(srv_reasoning_finish(&p, &r, &c), 0);
    srv_reasoning_free(&p);
    split s = {kvs_buf_take(&r), kvs_buf_take(&c)};
    cr_assert(s.reasoning && s.content);
    return s;
}

static bool ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    cr_assert(d);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* The reference for THINK, on the whole text at once. */
static split think_ref(const char *t, bool open) {
    size_t n = strlen(t), i = 0;
    while (i < n && ws(t[i])) i++;
    bool block = open;
    if (!strncmp(t + i, "<think>", 7)) { block = true; i += 7; }
    if (!block) return (split){dup_n("", 0), dup_n(t, n)};
    const char *f = strstr(t + i, "</think>");
    size_t e = f ? (size_t)(f - t) : n, b = i;
    while (b < e && ws(t[b])) b++;
    while (e > b && ws(t[e - 1])) e--;
    split s = {dup_n(t + b, e - b), NULL};
    if (!f) { s.content = dup_n("", 0); return s; }
    size_t k = (size_t)(f - t) + 8;
    while (k < n && ws(t[k])) k++;
    s.content = dup_n(t + k, n - k);
    return s;
}

static void expect(srv_reasoning_syntax syn, bool open, const char *text, const char *r, const char *c) {
    unsigned seed = 7;
    for (int max = 0; max <= 5; max++) {
        split s = run_pieces(syn, open, text, &seed, max);
        cr_assert_str_eq(s.reasoning, r, "reasoning of [%s] (pieces <= %d)", text, max);
        cr_assert_str_eq(s.content, c, "content of [%s] (pieces <= %d)", text, max);
        split_free(&s);
    }
}

Test(reasoning, think_cases) {
    expect(SRV_REASONING_THINK, false, "<think>\nLet me see.\n</think>\n\nParis.", "Let me see.", "Paris.");
    expect(SRV_REASONING_THINK, false, "  <think>a</think>b", "a", "b");
    expect(SRV_REASONING_THINK, false, "Paris <think>x</think>", "", "Paris <think>x</think>");
    expect(SRV_REASONING_THINK, false, "<thinking>x", "", "<thinking>x");
    expect(SRV_REASONING_THINK, false, "<thi", "", "<thi");
    expect(SRV_REASONING_THINK, false, "", "", "");
    /* open: the prompt ended with <think> */
    expect(SRV_REASONING_THINK, true, "\nhmm, 2+2\n</think>\n\n4", "hmm, 2+2", "4");
    expect(SRV_REASONING_THINK, true, "<think>again</think>x", "again", "x");
    expect(SRV_REASONING_THINK, true, "</think>\n\nno thought", "", "no thought");
    /* unterminated at max_tokens: all reasoning, a partial marker included */
    expect(SRV_REASONING_THINK, true, "still thinking </thi", "still thinking </thi", "");
    expect(SRV_REASONING_THINK, false, "<think>cut off  \n", "cut off", "");
    /* nested and stray markers */
    expect(SRV_REASONING_THINK, false, "<think>a <think>b</think> c</think>d", "a <think>b", "c</think>d");
    expect(SRV_REASONING_THINK, true, "x</think>y</think>z<think>", "x", "y</think>z<think>");
    /* tool calls stay in the content after the block */
    expect(SRV_REASONING_THINK, true, "call it</think>\n<tool_call>{\"name\":\"f\"}</tool_call>", "call it",
           "<tool_call>{\"name\":\"f\"}</tool_call>");
    /* OFF: all content */
    expect(SRV_REASONING_OFF, false, "<think>a</think>b", "", "<think>a</think>b");
}

/* Random texts made of marker fragments, cut at random points: the same result as the reference, whatever the
 * cuts. */
Test(reasoning, think_random_splits_match_reference) {
    static const char *const F[] = {"<think>", "</think>", "<", "</", "think", ">", "/", " ", "\n", "\t", "a", "bc",
                                    "\xc3\xa9", "</thi", "<thin", "nk>", "x y"};
    unsigned seed = 12345;
    char text[512];
    for (int it = 0; it < 4000; it++) {
        size_t len = 0;
        int parts = rand_r(&seed) % 14;
        for (int k = 0; k < parts; k++) {
            const char *f = F[rand_r(&seed) % (sizeof F / sizeof F[0])];
            size_t fl = strlen(f);
            if (len + fl >= sizeof text) break;
            memcpy(text + len, f, fl);
            len += fl;
        }
        text[len] = 0;
        bool open = rand_r(&seed) & 1;
        split want = think_ref(text, open);
        for (int rep = 0; rep < 4; rep++) {
            split got = run_pieces(SRV_REASONING_THINK, open, text, &seed, 1 + rep * 3);
            cr_assert_str_eq(got.reasoning, want.reasoning, "reasoning of [%s] open %d", text, open);
            cr_assert_str_eq(got.content, want.content, "content of [%s] open %d", text, open);
            split_free(&got);
        }
        split_free(&want);
    }
}

/* Nothing is held back but what may still be a marker or trimmed whitespace: streaming gives out text early. */
Test(reasoning, think_holds_back_only_marker_prefixes) {
    srv_reasoning p;
    srv_reasoning_init(&p, SRV_REASONING_THINK, true);
    kvs_buf r = {0}, c = {0};
    cr_assert_eq(srv_reasoning_feed(&p, "abc </th", 8, &r, &c), 0);
    cr_assert_str_eq(r.data, "abc");
    cr_assert_eq(srv_reasoning_feed(&p, "ought", 5, &r, &c), 0);
    cr_assert_str_eq(r.data, "abc </thought");
    cr_assert_eq(srv_reasoning_feed(&p, "</think>\n\nHi", 12, &r, &c), 0);
    cr_assert_str_eq(c.data, "Hi");
    cr_assert(p.saw_reasoning);
    srv_reasoning_free(&p);
    kvs_buf_free(&r);
    kvs_buf_free(&c);
}

static const char H1[] = "<|channel|>analysis<|message|>User asks weather. Use tool.<|end|>"
                         "<|start|>assistant<|channel|>final<|message|>It is sunny.";
static const char H2[] = "<|channel|>analysis<|message|>Need weather.<|end|>"
                         "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                         "<|message|>{\"city\":\"Paris\"}";
static const char H3[] = "<|start|>assistant to=functions.f<|channel|>commentary json<|message|> {} <|call|>";

Test(reasoning, harmony_channels_and_calls) {
    expect(SRV_REASONING_HARMONY, false, H1, "User asks weather. Use tool.", "It is sunny.");
    expect(SRV_REASONING_HARMONY, false, H2, "Need weather.",
           "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}</tool_call>");
    expect(SRV_REASONING_HARMONY, false, H3, "", "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
    /* a preamble on commentary without a recipient is content; analysis cut off at max_tokens is reasoning */
    expect(SRV_REASONING_HARMONY, false, "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
           "<|channel|>analysis<|message|>half a thou", "half a thou", "Checking.");
    /* output that is not harmony, and a header cut off */
    expect(SRV_REASONING_HARMONY, false, "plain text <|end|>", "", "plain text <|end|>");
    expect(SRV_REASONING_HARMONY, false, "<|channel|>analy", "", "");
    expect(SRV_REASONING_HARMONY, false, "<|channel|>final<|message|>a <|b|> c<|return|>", "", "a <|b|> c");
}

Test(reasoning, harmony_random_splits_match_one_piece) {
    static const char *const F[] = {"<|channel|>", "analysis", "final", "commentary", " to=functions.g", "<|message|>",
                                    "<|end|>", "<|start|>assistant", "<|call|>", "<|", "|>", "x", " ", "{\"a\":1}",
                                    "<|constrain|>json"};
    unsigned seed = 99;
    char text[768];
    for (int it = 0; it < 3000; it++) {
        size_t len = 0;
        int parts = rand_r(&seed) % 16;
        for (int k = 0; k < parts; k++) {
            const char *f = F[rand_r(&seed) % (sizeof F / sizeof F[0])];
            size_t fl = strlen(f);
            if (len + fl >= sizeof text) break;
            memcpy(text + len, f, fl);
            len += fl;
        }
        text[len] = 0;
        split want = run_pieces(SRV_REASONING_HARMONY, false, text, &seed, 0);
        for (int rep = 0; rep < 3; rep++) {
            split got = run_pieces(SRV_REASONING_HARMONY, false, text, &seed, 1 + rep * 4);
            cr_assert_str_eq(got.reasoning, want.reasoning, "reasoning of [%s]", text);
            cr_assert_str_eq(got.content, want.content, "content of [%s]", text);
            split_free(&got);
        }
        split_free(&want);
    }
}

/* srv_reasoning_inside (what counts reasoning tokens) fed one byte at a time: true exactly from the end of the
 * analysis header to the end of its "<|end|>" (HARMONY), from the start to the end of "</think>" (THINK, open). */
static void inside_walk(srv_reasoning_syntax syn, bool open, const char *text, size_t a, size_t e) {
    srv_reasoning p;
    srv_reasoning_init(&p, syn, open);
    kvs_buf r = {0}, c = {0};
    for (size_t i = 0; text[i]; i++) {
        cr_assert_eq(srv_reasoning_inside(&p), i >= a && i < e, "[%s] after %zu bytes", text, i);
        cr_assert_eq(srv_reasoning_feed(&p, text + i, 1, &r, &c), 0);
    }
    cr_assert_not(srv_reasoning_inside(&p));
    srv_reasoning_free(&p);
    kvs_buf_free(&r);
    kvs_buf_free(&c);
}

Test(reasoning, inside_follows_reasoning) {
    const size_t hdr = strlen("<|channel|>analysis<|message|>");
    inside_walk(SRV_REASONING_HARMONY, false, H1, hdr, hdr + strlen("User asks weather. Use tool.<|end|>"));
    inside_walk(SRV_REASONING_THINK, true, "\nplan\n</think>\n\nanswer", 0, strlen("\nplan\n</think>"));
    inside_walk(SRV_REASONING_THINK, false, "<think>plan</think>answer", strlen("<think>"),
                strlen("<think>plan</think>"));
    inside_walk(SRV_REASONING_OFF, false, "<think>plan</think>answer", 0, 0);
    cr_assert_not(srv_reasoning_inside(NULL));
}

Test(reasoning, detection_and_names) {
    cr_assert_eq(srv_reasoning_detect(NULL), SRV_REASONING_OFF);
    cr_assert_eq(srv_reasoning_detect("{{ '<|im_start|>assistant\\n' }}"), SRV_REASONING_OFF);
    cr_assert_eq(srv_reasoning_detect("{{ '<|im_start|>assistant\\n<think>\\n' }}"), SRV_REASONING_THINK);
    cr_assert_eq(srv_reasoning_detect("{% if '</think>' in c %}"), SRV_REASONING_THINK);
    cr_assert_eq(srv_reasoning_detect("<|start|>assistant<|channel|>analysis<|message|>"), SRV_REASONING_HARMONY);
    srv_reasoning_format f = SRV_REASONING_FORMAT_NONE;
    cr_assert_eq(srv_reasoning_format_from_name("deepseek", &f), 0);
    cr_assert_eq(f, SRV_REASONING_FORMAT_DEEPSEEK);
    cr_assert_eq(srv_reasoning_format_from_name("deepseek-legacy", &f), KVS_ERR_INVALID);
    cr_assert_eq(f, SRV_REASONING_FORMAT_DEEPSEEK);
    cr_assert_str_eq(srv_reasoning_format_name(SRV_REASONING_FORMAT_AUTO), "auto");
    cr_assert_eq(srv_reasoning_effective(SRV_REASONING_FORMAT_NONE, SRV_REASONING_THINK), SRV_REASONING_OFF);
    cr_assert_eq(srv_reasoning_effective(SRV_REASONING_FORMAT_AUTO, SRV_REASONING_OFF), SRV_REASONING_OFF);
    cr_assert_eq(srv_reasoning_effective(SRV_REASONING_FORMAT_DEEPSEEK, SRV_REASONING_OFF), SRV_REASONING_THINK);
    cr_assert_eq(srv_reasoning_effective(SRV_REASONING_FORMAT_AUTO, SRV_REASONING_HARMONY), SRV_REASONING_HARMONY);
    cr_assert(srv_reasoning_prompt_open("<|im_start|>assistant\n<think>\n", 30));
    cr_assert(!srv_reasoning_prompt_open("<think>\n\n</think>\n\n", 20));
    cr_assert(!srv_reasoning_prompt_open("assistant\n", 10));
    cr_assert_eq(srv_reasoning_feed(NULL, "x", 1, NULL, NULL), KVS_ERR_INVALID);
}

/*
 * cmd_tokenize.c: `kvserve tokenize -m MODEL (-p TEXT | -f FILE) [--no-special] [--no-parse-special] [--json]`
 *
 * Loads only the model's vocabulary and prints the token ids of the text: with --json one object
 * {"tokens":[...]}, otherwise one line per token: `ID 'PIECE'` (the piece with special tokens rendered).
 * -f reads the file's exact bytes as one text. --no-special: no BOS/EOS. --no-parse-special: the text of
 * control tokens stays text.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/engine.h"
#include "tools/cli.h"
#include "tools/commands.h"

typedef struct tok_opts {
    const char *model_path, *prompt, *file;
    bool add_special, parse_special, json;
} tok_opts;

#define O(f) offsetof(tok_opts, f)
static const kvs_opt tok_opts_table[] = {
    {"--model", "-m", KVS_OPT_STR, O(model_path), .arg = "FILE", .help = "GGUF model (only its vocabulary is loaded)"},
    {"--prompt", "-p", KVS_OPT_STR, O(prompt), .arg = "TEXT", .help = "text to tokenize"},
    {"--file", "-f", KVS_OPT_STR, O(file), .arg = "FILE", .help = "tokenize the file's exact bytes"},
    {"--no-special", NULL, KVS_OPT_FLAG, O(add_special), .flag_value = false, .help = "do not add BOS/EOS"},
    {"--no-parse-special", NULL, KVS_OPT_FLAG, O(parse_special), .flag_value = false,
     .help = "treat the text of special tokens as plain text"},
    {"--json", NULL, KVS_OPT_FLAG, O(json), .flag_value = true, .help = "print {\"tokens\":[...]}"},
};
#undef O
static const kvs_cli tok_cli = {
    "tokenize", "-m MODEL (-p TEXT | -f FILE) [--no-special] [--no-parse-special] [--json]", NULL, NULL,
    tok_opts_table, sizeof tok_opts_table / sizeof tok_opts_table[0], 0,
};

static int read_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) { fclose(f); return -1; }
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); fclose(f); return -1; }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return -1; }
    *out = buf;
    *len = n;
    return 0;
}

/* Length of the well-formed UTF-8 sequence at p[0..n) (2..4), or 0. */
static size_t utf8_seq(const unsigned char *p, size_t n) {
    size_t len = p[0] >= 0xC2 && p[0] <= 0xDF ? 2 : p[0] >= 0xE0 && p[0] <= 0xEF ? 3 : p[0] >= 0xF0 && p[0] <= 0xF4 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    unsigned char lo = p[0] == 0xE0 ? 0xA0 : p[0] == 0xF0 ? 0x90 : 0x80;
    unsigned char hi = p[0] == 0xED ? 0x9F : p[0] == 0xF4 ? 0x8F : 0xBF;
    if (p[1] < lo || p[1] > hi) return 0;
    for (size_t k = 2; k < len; k++)
        if (p[k] < 0x80 || p[k] > 0xBF) return 0;
    return len;
}

/* Prints a piece between single quotes, escaping quotes, backslashes, control bytes and bytes that are not part
 * of well-formed UTF-8 (a token may hold part of a character). */
static void print_piece(const char *p, size_t n) {
    putchar('\'');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t k;
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\'' || c == '\\') { putchar('\\'); putchar(c); }
        else if (c < 0x20 || c == 0x7F) printf("\\x%02x", c);
        else if (c < 0x80) putchar(c);
        else if ((k = utf8_seq((const unsigned char *)p + i, n - i)) > 0) { fwrite(p + i, 1, k, stdout); i += k; continue; }
        else printf("\\x%02x", c);
        i++;
    }
    putchar('\'');
}

int kvs_cmd_tokenize(int argc, char **argv) {
    tok_opts o = {.add_special = true, .parse_special = true};
    int prc = kvs_cli_parse(&tok_cli, &o, argc, argv, NULL, NULL);
    if (prc) return prc == 1 ? 0 : 2;
    if (!o.model_path || (!o.prompt == !o.file)) {
        kvs_cli_fail(&tok_cli, "need -m MODEL and exactly one of -p TEXT / -f FILE");
        kvs_cli_usage(&tok_cli, stderr);
        return 2;
    }
    const char *model_path = o.model_path, *prompt = o.prompt, *file = o.file;
    bool add_special = o.add_special, parse_special = o.parse_special, json = o.json;

    char *text = NULL;
    size_t len = 0;
    if (file) {
        if (read_file(file, &text, &len)) {
            fprintf(stderr, "kvserve tokenize: cannot read %s: %s\n", file, strerror(errno));
            return 1;
        }
    }

    eng_load_params lp;
    eng_load_params_default(&lp);
    lp.vocab_only = true;
    eng_model *model = NULL;
    char err[512] = "";
    int rc = eng_model_load(model_path, &lp, &model, err, sizeof err);
    if (rc != ENG_OK) {
        fprintf(stderr, "kvserve tokenize: %s (%s)\n", err[0] ? err : model_path, kvs_strerror(rc));
        free(text);
        return 1;
    }

    const char *src = file ? text : prompt;
    if (!file) len = strlen(prompt);
    int32_t n = 0, cap = (int32_t)(len + 16 < 1u << 30 ? len + 16 : 1u << 30);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int status = 1;
    if (!ids) {
        fprintf(stderr, "kvserve tokenize: out of memory\n");
        goto out;
    }
    rc = eng_tokenize(model, src, len, add_special, parse_special, ids, cap, &n);
    if (rc == ENG_ERR_TOO_LARGE) {
        int32_t *nids = realloc(ids, (size_t)n * sizeof *ids);
        if (!nids) { fprintf(stderr, "kvserve tokenize: out of memory\n"); goto out; }
        ids = nids;
        cap = n;
        rc = eng_tokenize(model, src, len, add_special, parse_special, ids, cap, &n);
    }
    if (rc != ENG_OK) {
        fprintf(stderr, "kvserve tokenize: %s\n", kvs_strerror(rc));
        goto out;
    }
    if (json) {
        fputs("{\"tokens\":[", stdout);
        for (int32_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
        fputs("]}\n", stdout);
    } else {
        char small[256];
        for (int32_t i = 0; i < n; i++) {
            size_t pn = 0;
            char *piece = small;
            rc = eng_token_to_piece(model, ids[i], true, small, sizeof small, &pn);
            if (rc == ENG_ERR_TOO_LARGE) {
                piece = malloc(pn);
                if (!piece) { fprintf(stderr, "kvserve tokenize: out of memory\n"); goto out; }
                rc = eng_token_to_piece(model, ids[i], true, piece, pn, &pn);
            }
            if (rc != ENG_OK) pn = 0;
            printf("%d ", (int)ids[i]);
            print_piece(piece, pn);
            putchar('\n');
            if (piece != small) free(piece);
        }
    }
    status = fflush(stdout) == 0 ? 0 : 1;
out:
    free(ids);
    free(text);
    eng_model_free(model);
    return status;
}

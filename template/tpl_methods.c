/* tpl_methods.c: the methods of strings, lists, dicts and loop objects with Python's semantics (moved out of
 * tpl_builtins.c, whose helpers they share through tpl_internal.h). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/tpl_internal.h"

/* ---- methods ------------------------------------------------------------------------------------------------- */

static int str_split(tctx *c, const node *n, tstr *s, tstr *sep, int64_t maxsplit, bool right, tv *out) {
    int rc = tcont_new(c, n, TC_LIST, 0, out);
    if (rc) return rc;
    tv piece;
    if (!sep) {
        /* runs of whitespace; leading/trailing ignored */
        if (!right) {
            size_t i = 0;
            int64_t done = 0;
            for (;;) {
                uint32_t cp;
                while (i < s->len) { size_t l = tpl_u8_dec(s->data + i, s->len - i, &cp); if (!tpl_py_space(cp)) break; i += l; }
                if (i >= s->len) break;
                size_t j = i;
                if (maxsplit >= 0 && done >= maxsplit) {
                    /* the rest, with trailing whitespace stripped */
                    size_t e = s->len;
                    while (e > i) { size_t p = tpl_prev_cp(s->data, e); tpl_u8_dec(s->data + p, e - p, &cp); if (!tpl_py_space(cp)) break; e = p; }
                    if ((rc = tstr_sub(c, n, s, i, e - i, &piece)) || (rc = tlist_push(c, n, out->c, piece))) return rc;
                    break;
                }
                while (j < s->len) { size_t l = tpl_u8_dec(s->data + j, s->len - j, &cp); if (tpl_py_space(cp)) break; j += l; }
                if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, i, j - i, &piece)) || (rc = tlist_push(c, n, out->c, piece))) return rc;
                done++;
                i = j;
            }
            return 0;
        }
        /* rsplit(None, maxsplit) */
        size_t e = s->len;
        int64_t done = 0;
        tv rev;
        if ((rc = tcont_new(c, n, TC_LIST, 0, &rev))) return rc;
        for (;;) {
            uint32_t cp;
            while (e > 0) { size_t p = tpl_prev_cp(s->data, e); tpl_u8_dec(s->data + p, e - p, &cp); if (!tpl_py_space(cp)) break; e = p; }
            if (e == 0) break;
            size_t b = e;
            if (maxsplit >= 0 && done >= maxsplit) {
                size_t i = 0;
                while (i < e) { size_t l = tpl_u8_dec(s->data + i, e - i, &cp); if (!tpl_py_space(cp)) break; i += l; }
                if ((rc = tstr_sub(c, n, s, i, e - i, &piece)) || (rc = tlist_push(c, n, rev.c, piece))) break;
                break;
            }
            while (b > 0) { size_t p = tpl_prev_cp(s->data, b); tpl_u8_dec(s->data + p, b - p, &cp); if (tpl_py_space(cp)) break; b = p; }
            if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, b, e - b, &piece)) || (rc = tlist_push(c, n, rev.c, piece))) break;
            done++;
            e = b;
        }
        for (size_t i = rev.c->n; !rc && i-- > 0;) { tv_incref(rev.c->items[i]); rc = tlist_push(c, n, out->c, rev.c->items[i]); }
        tv_decref(c, rev);
        return rc;
    }
    if (!sep->len) return tpl_fail(c, n, KVS_ERR_INVALID, "empty separator");
    if (!right) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const char *f = (maxsplit < 0 || done < maxsplit) && i <= s->len ? memmem(s->data + i, s->len - i, sep->data, sep->len) : NULL;
            size_t j = f ? (size_t)(f - s->data) : s->len;
            if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, i, j - i, &piece)) || (rc = tlist_push(c, n, out->c, piece))) return rc;
            if (!f) break;
            i = j + sep->len;
            done++;
        }
        return 0;
    }
    tv rev;
    if ((rc = tcont_new(c, n, TC_LIST, 0, &rev))) return rc;
    size_t e = s->len;
    int64_t done = 0;
    for (;;) {
        size_t found = (size_t)-1;
        if ((maxsplit < 0 || done < maxsplit) && e >= sep->len)
            for (size_t p = e - sep->len + 1; p-- > 0;)
                if (!memcmp(s->data + p, sep->data, sep->len)) { found = p; break; }
        size_t b = found == (size_t)-1 ? 0 : found + sep->len;
        if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, b, e - b, &piece)) || (rc = tlist_push(c, n, rev.c, piece))) break;
        if (found == (size_t)-1) break;
        e = found;
        done++;
    }
    for (size_t i = rev.c->n; !rc && i-- > 0;) { tv_incref(rev.c->items[i]); rc = tlist_push(c, n, out->c, rev.c->items[i]); }
    tv_decref(c, rev);
    return rc;
}

/* Python str.format: {} {0} {name} {{ }} and the conversions !s !r; format specs are not supported */
static int str_format(tctx *c, const node *n, tstr *f, fargs *a, tv *out) {
    tsink sk = {0};
    int rc = 0, autoi = 0;
    for (size_t i = 0; i < f->len && !rc; i++) {
        char ch = f->data[i];
        if (ch == '}' ) {
            if (i + 1 < f->len && f->data[i + 1] == '}') i++;
            else { rc = tpl_fail(c, n, KVS_ERR_INVALID, "single '}' encountered in format string"); break; }
            rc = tsink_put(c, n, &sk, "}", 1, false);
            continue;
        }
        if (ch != '{') { rc = tsink_put(c, n, &sk, &ch, 1, false); continue; }
        if (i + 1 < f->len && f->data[i + 1] == '{') { i++; rc = tsink_put(c, n, &sk, "{", 1, false); continue; }
        size_t j = i + 1;
        while (j < f->len && f->data[j] != '}') j++;
        if (j >= f->len) { rc = tpl_fail(c, n, KVS_ERR_INVALID, "single '{' encountered in format string"); break; }
        char field[128];
        size_t fl = j - i - 1 < sizeof field - 1 ? j - i - 1 : sizeof field - 1;
        memcpy(field, f->data + i + 1, fl);
        field[fl] = 0;
        i = j;
        char conv = 's';
        char *bang = strchr(field, '!');
        if (strchr(field, ':')) { rc = tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "format specs are not supported"); break; }
        if (bang) { conv = bang[1]; *bang = 0; }
        tv *v = NULL;
        if (!field[0]) v = tpl_arg(a, autoi++, NULL);
        else if (isdigit((unsigned char)field[0])) v = tpl_arg(a, atoi(field), NULL);
        else v = tpl_arg(a, -1, field);
        if (!v) { rc = tpl_fail(c, n, KVS_ERR_INVALID, "format field '%s' has no argument", field); break; }
        if (conv == 'r') {
            kvs_buf b = {0};
            rc = tv_repr(c, n, *v, &b, 1);
            if (!rc) rc = tsink_put(c, n, &sk, b.data ? b.data : "", b.len, false);
            kvs_buf_free(&b);
        } else rc = tv_print(c, n, *v, &sk);
    }
    if (!rc) rc = tsink_take(c, n, &sk, out);
    tsink_free(&sk);
    return rc;
}

static bool affix(tstr *s, tstr *p, bool end) {
    return p->len <= s->len && !memcmp(s->data + (end ? s->len - p->len : 0), p->data, p->len);
}

/* ---- string methods: each gets the string, the name it was called by and the arguments ---------------------- */
static int str_startswith(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    bool end = name[0] == 'e';
    tv *p = tpl_arg(a, 0, NULL);
    *out = tv_bool(false);
    if (p && p->t == TV_STR) *out = tv_bool(affix(s, p->s, end));
    else if (p && p->t == TV_LIST && p->c->kind == TC_TUPLE) {
        for (size_t i = 0; i < p->c->n; i++) {
            if (p->c->items[i].t != TV_STR) return tpl_fail(c, n, KVS_ERR_TYPE, "tuple for %s must only contain str", name);
            if (affix(s, p->c->items[i].s, end)) { *out = tv_bool(true); break; }
        }
    } else return tpl_fail(c, n, KVS_ERR_TYPE, "%s first arg must be str or a tuple of str", name);
    return 0;
}

static int str_strip(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    tv *ch = tpl_arg(a, 0, "chars");
    if (ch && ch->t != TV_NONE && ch->t != TV_STR) return tpl_fail(c, n, KVS_ERR_TYPE, "%s arg must be None or str", name);
    return tpl_strip(c, n, s, ch && ch->t == TV_STR ? ch->s : NULL, name[0] == 'l' ? 1 : name[0] == 'r' ? 2 : 3, out);
}

static int str_split_m(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    tv *sep = tpl_arg(a, 0, "sep"), *mx = tpl_arg(a, 1, "maxsplit");
    if (sep && sep->t != TV_NONE && sep->t != TV_STR) return tpl_fail(c, n, KVS_ERR_TYPE, "must be str or None");
    return str_split(c, n, s, sep && sep->t == TV_STR ? sep->s : NULL, mx && tpl_is_intlike(*mx) ? tpl_ival(*mx) : -1,
                     name[0] == 'r', out);
}

static int str_replace(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    (void)name;
    int rc;
    tstr *x = NULL, *y = NULL;
    tv *cnt = tpl_arg(a, 2, "count");
    if ((rc = tpl_need_str(c, n, tpl_arg(a, 0, NULL), "replace's old", &x)) || (rc = tpl_need_str(c, n, tpl_arg(a, 1, NULL), "replace's new", &y)))
        return rc;
    return tpl_replace(c, n, s, x, y, cnt && tpl_is_intlike(*cnt) ? tpl_ival(*cnt) : -1, out);
}

/* upper, lower, title, capitalize */
static int str_case(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    (void)a;
    int mode = name[0] == 'u' ? CASE_UPPER : name[0] == 'l' ? CASE_LOWER : name[0] == 't' ? CASE_TITLE : CASE_CAP;
    return tpl_case(c, n, s, mode, out);
}

static int str_swapcase(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    (void)name; (void)a;
    int rc;
    tstr *r = NULL;
    if ((rc = tstr_alloc(c, n, s->len, &r))) return rc;
    for (size_t i = 0; i < s->len; i++) {
        unsigned char ch = (unsigned char)s->data[i];
        r->data[i] = (char)(ch < 0x80 ? (isupper(ch) ? tolower(ch) : toupper(ch)) : ch);
    }
    *out = tv_str(r);
    return 0;
}

static int str_format_m(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    (void)name;
    return str_format(c, n, s, a, out);
}

/* find, rfind, index, count */
static int str_find(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    int rc;
    tstr *x = NULL;
    if ((rc = tpl_need_str(c, n, tpl_arg(a, 0, NULL), "the substring", &x))) return rc;
    if (!strcmp(name, "count")) {
        int64_t k = 0;
        if (!x->len) k = (int64_t)tpl_u8_len(s->data, s->len) + 1;
        else for (size_t i = 0; i + x->len <= s->len;) {
            const char *f = memmem(s->data + i, s->len - i, x->data, x->len);
            if (!f) break;
            k++;
            i = (size_t)(f - s->data) + x->len;
        }
        *out = tv_int(k);
        return 0;
    }
    size_t found = (size_t)-1;
    if (name[0] == 'r') {
        if (x->len <= s->len)
            for (size_t p = s->len - x->len + 1; p-- > 0;)
                if (!memcmp(s->data + p, x->data, x->len)) { found = p; break; }
    } else {
        const char *f = x->len ? memmem(s->data, s->len, x->data, x->len) : s->data;
        if (f) found = (size_t)(f - s->data);
    }
    if (found == (size_t)-1 && name[0] == 'i') return tpl_fail(c, n, KVS_ERR_INVALID, "substring not found");
    *out = tv_int(found == (size_t)-1 ? -1 : (int64_t)tpl_u8_len(s->data, found));
    return 0;
}

static int str_join(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    (void)name;
    int rc;
    tv *seq = tpl_arg(a, 0, NULL);
    if (!seq) return tpl_fail(c, n, KVS_ERR_TYPE, "join() takes exactly one argument");
    tv items;
    if ((rc = tpl_iter_list(c, n, *seq, &items))) return rc;
    for (size_t i = 0; i < items.c->n; i++)
        if (items.c->items[i].t != TV_STR) {
            tv_decref(c, items);
            return tpl_fail(c, n, KVS_ERR_TYPE, "sequence item %zu: expected str instance, %s found", i, tv_typename(items.c->items[i]));
        }
    rc = tpl_join(c, n, items, s, NULL, out);
    tv_decref(c, items);
    return rc;
}

static int str_splitlines(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    (void)name; (void)a;
    int rc;
    if ((rc = tcont_new(c, n, TC_LIST, 0, out))) return rc;
    size_t i = 0;
    while (i < s->len) {
        size_t j = i;
        while (j < s->len && s->data[j] != '\n' && s->data[j] != '\r') j++;
        tv piece;
        if ((rc = tpl_step(c, n)) || (rc = tstr_sub(c, n, s, i, j - i, &piece)) || (rc = tlist_push(c, n, out->c, piece))) return rc;
        if (j < s->len && s->data[j] == '\r' && j + 1 < s->len && s->data[j + 1] == '\n') j++;
        i = j + 1;
    }
    return 0;
}

/* isdigit, isalpha, isalnum, isspace, islower, isupper */
static int str_is(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    (void)c; (void)n; (void)a;
    bool r = s->len > 0, cased = false;
    for (size_t i = 0; i < s->len && r; i++) {
        unsigned char ch = (unsigned char)s->data[i];
        if (!strcmp(name, "isdigit")) r = isdigit(ch);
        else if (!strcmp(name, "isalpha")) r = isalpha(ch) || ch >= 0x80;
        else if (!strcmp(name, "isalnum")) r = isalnum(ch) || ch >= 0x80;
        else if (!strcmp(name, "isspace")) r = isspace(ch) != 0;
        else if (!strcmp(name, "islower")) { r = !isupper(ch); cased = cased || islower(ch); }
        else if (!strcmp(name, "isupper")) { r = !islower(ch); cased = cased || isupper(ch); }
    }
    if (!strcmp(name, "islower") || !strcmp(name, "isupper")) r = r && cased;
    *out = tv_bool(r);
    return 0;
}

/* removeprefix, removesuffix */
static int str_remove_affix(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out) {
    int rc;
    tstr *x = NULL;
    if ((rc = tpl_need_str(c, n, tpl_arg(a, 0, NULL), "the affix", &x))) return rc;
    bool end = name[6] == 's';
    if (!affix(s, x, end)) return tstr_sub(c, n, s, 0, s->len, out);
    return tstr_sub(c, n, s, end ? 0 : x->len, s->len - x->len, out);
}

/* ---- list methods: each gets the list, the name it was called by and the arguments; *out is None unless
 * the method returns a value ------------------------------------------------------------------------------------ */
static int list_append(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    (void)name; (void)out;
    tv *x = tpl_arg(a, 0, NULL);
    if (!x) return tpl_fail(c, n, KVS_ERR_TYPE, "append() takes exactly one argument");
    tv_incref(*x);
    return tlist_push(c, n, l, *x);
}

static int list_pop(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    (void)name;
    tv *x = tpl_arg(a, 0, NULL);
    if (!l->n) return tpl_fail(c, n, KVS_ERR_INVALID, "pop from empty list");
    int64_t i = x && tpl_is_intlike(*x) ? tpl_ival(*x) : -1;
    if (i < 0) i += (int64_t)l->n;
    if (i < 0 || (size_t)i >= l->n) return tpl_fail(c, n, KVS_ERR_INVALID, "pop index out of range");
    *out = l->items[i];
    memmove(l->items + i, l->items + i + 1, (l->n - (size_t)i - 1) * sizeof *l->items);
    l->n--;
    return 0;
}

static int list_insert(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    (void)name; (void)out;
    int rc;
    tv *x = tpl_arg(a, 0, NULL), *v = tpl_arg(a, 1, NULL);
    if (!x || !v || !tpl_is_intlike(*x)) return tpl_fail(c, n, KVS_ERR_TYPE, "insert(index, value)");
    int64_t i = tpl_ival(*x);
    if (i < 0) i += (int64_t)l->n;
    if (i < 0) i = 0;
    if ((size_t)i > l->n) i = (int64_t)l->n;
    tv_incref(*v);
    if ((rc = tlist_push(c, n, l, *v))) return rc;
    memmove(l->items + i + 1, l->items + i, (l->n - 1 - (size_t)i) * sizeof *l->items);
    l->items[i] = *v;
    return 0;
}

static int list_extend(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    (void)name; (void)out;
    int rc;
    tv *x = tpl_arg(a, 0, NULL);
    if (!x) return tpl_fail(c, n, KVS_ERR_TYPE, "extend() takes exactly one argument");
    tv items;
    if ((rc = tpl_iter_list(c, n, *x, &items))) return rc;
    for (size_t i = 0; i < items.c->n && !rc; i++) { tv_incref(items.c->items[i]); rc = tlist_push(c, n, l, items.c->items[i]); }
    tv_decref(c, items);
    return rc;
}

/* index, count, remove */
static int list_find(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    int rc;
    tv *x = tpl_arg(a, 0, NULL);
    if (!x) return tpl_fail(c, n, KVS_ERR_TYPE, "%s() takes exactly one argument", name);
    int64_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        bool eq;
        if ((rc = tpl_equal(c, n, l->items[i], *x, &eq))) return rc;
        if (!eq) continue;
        if (name[0] == 'i') { *out = tv_int((int64_t)i); return 0; }
        if (name[0] == 'r') {
            tv old = l->items[i];
            memmove(l->items + i, l->items + i + 1, (l->n - i - 1) * sizeof *l->items);
            l->n--;
            tv_decref(c, old);
            return 0;
        }
        k++;
    }
    if (name[0] != 'c') return tpl_fail(c, n, KVS_ERR_INVALID, "value is not in list");
    *out = tv_int(k);
    return 0;
}

static int list_reverse(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    (void)c; (void)n; (void)name; (void)a; (void)out;
    for (size_t i = 0; i < l->n / 2; i++) { tv t = l->items[i]; l->items[i] = l->items[l->n - 1 - i]; l->items[l->n - 1 - i] = t; }
    return 0;
}

static int list_clear(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    (void)n; (void)name; (void)a; (void)out;
    while (l->n) tv_decref(c, l->items[--l->n]);
    return 0;
}

/* copy, sort */
static int list_copy_sort(tctx *c, const node *n, tcont *l, const char *name, fargs *a, tv *out) {
    int rc;
    tv self = {.t = TV_LIST};
    self.c = l;
    if (name[0] == 'c') return tpl_iter_list(c, n, self, out);
    tv sorted;
    tv *key = tpl_arg(a, -1, "key");
    if (key) return tpl_fail(c, n, KVS_ERR_UNSUPPORTED, "sort(key=...) is not supported");
    if ((rc = tpl_sort_list(c, n, self, NULL, false, tpl_arg_bool(a, -1, "reverse", false), TC_LIST, &sorted))) return rc;
    for (size_t i = 0; i < l->n; i++) {
        tv old = l->items[i];
        l->items[i] = sorted.c->items[i];
        tv_incref(l->items[i]);
        tv_decref(c, old);
    }
    tv_decref(c, sorted);
    return 0;
}

/* ---- dict methods ------------------------------------------------------------------------------------------- */
/* items, keys, values */
static int dict_view(tctx *c, const node *n, tcont *d, const char *name, fargs *a, tv *out) {
    (void)a;
    int rc;
    if ((rc = tcont_new(c, n, TC_LIST, d->n, out))) return rc;
    for (size_t i = 0; i < d->n; i++) {
        tv x;
        if (name[0] == 'i') {
            if ((rc = tcont_new(c, n, TC_TUPLE, 2, &x))) return rc;
            tv_incref(d->keys[i]);
            tv_incref(d->items[i]);
            tlist_push(c, n, x.c, d->keys[i]);
            tlist_push(c, n, x.c, d->items[i]);
        } else {
            x = name[0] == 'k' ? d->keys[i] : d->items[i];
            tv_incref(x);
        }
        if ((rc = tlist_push(c, n, out->c, x))) return rc;
    }
    return 0;
}

/* get, pop, setdefault */
static int dict_get(tctx *c, const node *n, tcont *d, const char *name, fargs *a, tv *out) {
    tv *k = tpl_arg(a, 0, NULL), *dv = tpl_arg(a, 1, "default");
    if (!k) return tpl_fail(c, n, KVS_ERR_TYPE, "%s expected at least 1 argument", name);
    tv *v = tdict_getv(d, *k);
    if (v) {
        *out = *v;
        tv_incref(*out);
        if (name[0] == 'p') return tdict_del(c, d, (size_t)(v - d->items)) ? tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory") : 0;
        return 0;
    }
    if (name[0] == 'p' && !dv) return tpl_fail(c, n, KVS_ERR_NOT_FOUND, "key not found");
    *out = dv ? *dv : tv_none();
    tv_incref(*out);
    if (name[0] == 's') {
        tv_incref(*out);
        return tdict_set(c, n, d, *k, *out);
    }
    return 0;
}

static int dict_update(tctx *c, const node *n, tcont *d, const char *name, fargs *a, tv *out) {
    (void)name;
    int rc;
    tv *k = tpl_arg(a, 0, NULL);
    *out = tv_none();
    if (k) {
        if (k->t != TV_DICT) return tpl_fail(c, n, KVS_ERR_TYPE, "update() needs a mapping");
        tcont *o = k->c;
        for (size_t i = 0; i < o->n; i++) {
            tv_incref(o->items[i]);
            if ((rc = tdict_set(c, n, d, o->keys[i], o->items[i]))) return rc;
        }
    }
    for (int i = 0; i < a->nkw; i++) {
        tv_incref(a->kwv[i]);
        if ((rc = tdict_setc(c, n, d, a->kwn[i], a->kwv[i]))) return rc;
    }
    return 0;
}

static int dict_copy(tctx *c, const node *n, tcont *d, const char *name, fargs *a, tv *out) {
    (void)name; (void)a;
    int rc;
    if ((rc = tcont_new(c, n, TC_DICT, d->n, out))) return rc;
    for (size_t i = 0; i < d->n; i++) {
        tv_incref(d->items[i]);
        if ((rc = tdict_set(c, n, out->c, d->keys[i], d->items[i]))) return rc;
    }
    return 0;
}

static int dict_clear(tctx *c, const node *n, tcont *d, const char *name, fargs *a, tv *out) {
    (void)name; (void)a;
    *out = tv_none();
    while (d->n)
        if (tdict_del(c, d, d->n - 1)) return tpl_fail(c, n, KVS_ERR_NOMEM, "out of memory");
    return 0;
}

/* ---- the tables: every method by name, in strcmp order (bsearch; tpl_methods_sorted checks) --------------- */
typedef struct str_entry {
    const char *name;
    int (*fn)(tctx *c, const node *n, tstr *s, const char *name, fargs *a, tv *out);
} str_entry;
typedef struct cont_entry {
    const char *name;
    int (*fn)(tctx *c, const node *n, tcont *self, const char *name, fargs *a, tv *out);
} cont_entry;

static const str_entry str_methods[] = {
    {"capitalize", str_case},         {"count", str_find},                 {"endswith", str_startswith},
    {"find", str_find},               {"format", str_format_m},            {"index", str_find},
    {"isalnum", str_is},              {"isalpha", str_is},                 {"isdigit", str_is},
    {"islower", str_is},              {"isspace", str_is},                 {"isupper", str_is},
    {"join", str_join},               {"lower", str_case},                 {"lstrip", str_strip},
    {"removeprefix", str_remove_affix}, {"removesuffix", str_remove_affix}, {"replace", str_replace},
    {"rfind", str_find},              {"rsplit", str_split_m},             {"rstrip", str_strip},
    {"split", str_split_m},           {"splitlines", str_splitlines},      {"startswith", str_startswith},
    {"strip", str_strip},             {"swapcase", str_swapcase},          {"title", str_case},
    {"upper", str_case},
};
static const cont_entry list_methods[] = {
    {"append", list_append}, {"clear", list_clear},     {"copy", list_copy_sort}, {"count", list_find},
    {"extend", list_extend}, {"index", list_find},      {"insert", list_insert},  {"pop", list_pop},
    {"remove", list_find},   {"reverse", list_reverse}, {"sort", list_copy_sort},
};
static const cont_entry dict_methods[] = {
    {"clear", dict_clear}, {"copy", dict_copy},     {"get", dict_get},        {"items", dict_view},
    {"keys", dict_view},   {"pop", dict_get},       {"setdefault", dict_get}, {"update", dict_update},
    {"values", dict_view},
};
#define TABLE_FIND(t, name) tpl_table_find(t, sizeof t / sizeof t[0], sizeof t[0], name)
#define TABLE_SORTED(t) tpl_table_sorted(t, sizeof t / sizeof t[0], sizeof t[0])

bool tpl_methods_sorted(void) { return TABLE_SORTED(str_methods) && TABLE_SORTED(list_methods) && TABLE_SORTED(dict_methods); }

bool tpl_has_method(tv obj, const char *name) {
    switch (obj.t) {
    case TV_STR: return TABLE_FIND(str_methods, name) != NULL;
    case TV_LIST: return obj.c->kind != TC_GEN && TABLE_FIND(list_methods, name) &&
                         (obj.c->kind == TC_LIST || !strcmp(name, "index") || !strcmp(name, "count"));
    case TV_DICT: return obj.c->kind == TC_DICT && TABLE_FIND(dict_methods, name);
    case TV_LOOP: return !strcmp(name, "cycle");
    default: return false;
    }
}

int tpl_method(tctx *c, const node *n, tv obj, const char *name, tv *pos, int npos, const char **kwn, tv *kwv,
               int nkw, tv *out) {
    fargs a = {pos, npos, kwn, kwv, nkw};
    int rc;
    const str_entry *se;
    const cont_entry *ce;
    switch (obj.t) {
    case TV_STR:   /* scans of the whole string (find, count, strip, split...) cost by its size */
        if ((rc = tpl_charge(c, n, obj.s->len / TPL_BYTES_PER_STEP))) return rc;
        if (!(se = TABLE_FIND(str_methods, name))) return tpl_fail(c, n, KVS_ERR_TYPE, "'str' object has no attribute '%s'", name);
        return se->fn(c, n, obj.s, name, &a, out);
    case TV_LIST:   /* and of the whole list (insert, pop(0), remove...) */
        if ((rc = tpl_charge(c, n, obj.c->n / 16))) return rc;
        if (!(ce = TABLE_FIND(list_methods, name))) return tpl_fail(c, n, KVS_ERR_TYPE, "'list' object has no attribute '%s'", name);
        *out = tv_none();
        return ce->fn(c, n, obj.c, name, &a, out);
    case TV_DICT:
        if (!(ce = TABLE_FIND(dict_methods, name))) return tpl_fail(c, n, KVS_ERR_TYPE, "'dict' object has no attribute '%s'", name);
        return ce->fn(c, n, obj.c, name, &a, out);
    case TV_LOOP:
        if (!npos) return tpl_fail(c, n, KVS_ERR_TYPE, "no items for cycling given");
        *out = pos[obj.loop->index0 % npos];
        tv_incref(*out);
        return 0;
    default: return tpl_fail(c, n, KVS_ERR_TYPE, "'%s' object has no attribute '%s'", tv_typename(obj), name);
    }
}

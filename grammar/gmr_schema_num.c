/* gmr_schema_num.c: the integer and number rules of JSON Schema compilation (moved out of gmr_schema.c): digit
 * ranges for minimum/maximum bounds, within the max_digits / max_frac options. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gmr_internal.h"

/* ---- numbers ----------------------------------------------------------------------------------------------- */

static uint32_t digit_rule(gb *b, char lo, char hi) { return gmr_class_rule(b, NULL, lo, hi); }

/* Decimal strings of the same length n: every number from lo to hi (leading zeros as written). */
static void range_same(gb *b, uint32_t r, const char *lo, const char *hi, size_t n) {
    if (b->err) return;
    gb_seq q = {0};
    if (n == 1) {
        gb_ref(b, &q, digit_rule(b, lo[0], hi[0]));
        gb_alt(b, r, &q);
        return;
    }
    bool lo_zero = true, hi_nine = true;
    for (size_t k = 1; k < n; k++) lo_zero &= lo[k] == '0', hi_nine &= hi[k] == '9';
    uint32_t any = digit_rule(b, '0', '9');
    if (lo_zero && hi_nine) {
        gb_ref(b, &q, digit_rule(b, lo[0], hi[0]));
        gb_repeat(b, &q, any, (uint32_t)(n - 1), (uint32_t)(n - 1));
        gb_alt(b, r, &q);
        return;
    }
    if (lo[0] == hi[0]) {
        gb_byte(b, &q, (uint8_t)lo[0]);
        uint32_t sub = gb_rule_new(b);
        range_same(b, sub, lo + 1, hi + 1, n - 1);
        gb_ref(b, &q, sub);
        gb_alt(b, r, &q);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    uint32_t sub = gb_rule_new(b);
    gb_byte(b, &q, (uint8_t)lo[0]);
    range_same(b, sub, lo + 1, nines, n - 1);
    gb_ref(b, &q, sub);
    gb_alt(b, r, &q);
    if (lo[0] + 1 <= hi[0] - 1) {
        gb_ref(b, &q, digit_rule(b, (char)(lo[0] + 1), (char)(hi[0] - 1)));
        gb_repeat(b, &q, any, (uint32_t)(n - 1), (uint32_t)(n - 1));
        gb_alt(b, r, &q);
    }
    sub = gb_rule_new(b);
    gb_byte(b, &q, (uint8_t)hi[0]);
    range_same(b, sub, zeros, hi + 1, n - 1);
    gb_ref(b, &q, sub);
    gb_alt(b, r, &q);
}

/* Adds to r the alternatives writing every integer in [lo, hi] (no leading zeros). */
static void uint_range(gb *b, uint32_t r, uint64_t lo, uint64_t hi) {
    if (lo > hi) return;
    char a[24], z[24];
    for (int len = snprintf(a, sizeof a, "%llu", (unsigned long long)lo); lo <= hi && !b->err; len++) {
        /* the largest number with len digits */
        uint64_t top = 9;
        for (int k = 1; k < len; k++) top = top * 10 + 9;
        if (len >= 20) top = UINT64_MAX;
        uint64_t h = hi < top ? hi : top;
        snprintf(a, sizeof a, "%0*llu", len, (unsigned long long)lo);
        snprintf(z, sizeof z, "%0*llu", len, (unsigned long long)h);
        range_same(b, r, a, z, (size_t)len);
        if (h == hi || h == UINT64_MAX) break;
        lo = h + 1;
    }
}

static uint64_t pow10u(int d) {
    uint64_t p = 1;
    for (int k = 0; k < d; k++) p *= 10;
    return p;
}

/* Integers in [lo, hi] (already clamped to what can be written). */
static void int_range(gb *b, uint32_t r, int64_t lo, int64_t hi) {
    if (lo > hi) return;
    if (lo < 0) {   /* "-" magnitudes */
        uint64_t mlo = hi < 0 ? (uint64_t)(-(hi + 1)) + 1 : 1, mhi = (uint64_t)(-(lo + 1)) + 1;
        uint32_t m = gb_rule_new(b);
        gb_define(b, m);
        uint_range(b, m, mlo, mhi);
        gb_seq q = {0};
        gb_byte(b, &q, '-');
        gb_ref(b, &q, m);
        gb_alt(b, r, &q);
    }
    if (hi >= 0) uint_range(b, r, lo < 0 ? 0 : (uint64_t)lo, (uint64_t)hi);
}

int gmr_get_bounds(sctx *s, const cJSON *sch, bounds *bd) {
    bd->lo = -INFINITY;
    bd->hi = INFINITY;
    bd->lo_ex = bd->hi_ex = false;
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(sch, "minimum");
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(sch, "maximum");
    const cJSON *emn = cJSON_GetObjectItemCaseSensitive(sch, "exclusiveMinimum");
    const cJSON *emx = cJSON_GetObjectItemCaseSensitive(sch, "exclusiveMaximum");
    const cJSON *all[4] = {mn, mx, emn, emx};
    static const char *names[4] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++)
        if (all[k] && !cJSON_IsNumber(all[k]) && !(k >= 2 && cJSON_IsBool(all[k])))
            return gb_fail(s->b, KVS_ERR_FORMAT, "%s must be a number", names[k]);
    if (mn) bd->lo = mn->valuedouble, bd->lo_ex = cJSON_IsTrue(emn);
    if (mx) bd->hi = mx->valuedouble, bd->hi_ex = cJSON_IsTrue(emx);
    if (cJSON_IsNumber(emn) && (emn->valuedouble > bd->lo || (emn->valuedouble == bd->lo)))
        bd->lo = emn->valuedouble, bd->lo_ex = true;
    if (cJSON_IsNumber(emx) && (emx->valuedouble < bd->hi || (emx->valuedouble == bd->hi)))
        bd->hi = emx->valuedouble, bd->hi_ex = true;
    if (isnan(bd->lo) || isnan(bd->hi)) return gb_fail(s->b, KVS_ERR_FORMAT, "minimum/maximum is not a number");
    return 0;
}

static int64_t clamp_i(double v, int64_t lim) {
    if (v <= (double)-lim) return -lim;
    if (v >= (double)lim) return lim;
    return (int64_t)v;
}

uint32_t gmr_integer_rule(sctx *s, const bounds *bd, bool fail_empty) {
    gb *b = s->b;
    int64_t lim = (int64_t)(pow10u(s->o.max_digits) - 1);
    if (lim < 0 || s->o.max_digits >= 19) lim = INT64_MAX;
    int64_t lo = -lim, hi = lim;
    if (bd->lo > -INFINITY) {
        double v = bd->lo_ex ? floor(bd->lo) + 1 : ceil(bd->lo);
        lo = clamp_i(v, INT64_MAX);
        if (lo < -lim && bd->hi == INFINITY) lo = -lim;
        if (lo > 0 && hi < lo) hi = lo > INT64_MAX - lim ? INT64_MAX : lo + lim;
    }
    if (bd->hi < INFINITY) {
        double v = bd->hi_ex ? ceil(bd->hi) - 1 : floor(bd->hi);
        hi = clamp_i(v, INT64_MAX);
        if (hi < 0 && bd->lo == -INFINITY) lo = hi < INT64_MIN + lim ? -INT64_MAX : hi - lim;
    }
    uint32_t r = gb_rule_new(b);
    gb_define(b, r);
    int_range(b, r, lo, hi);
    if (!b->err && lo > hi && fail_empty)
        gb_fail(b, KVS_ERR_UNSUPPORTED, "minimum/maximum: no integer lies within the bounds");
    return r;
}

static uint32_t frac_rule(sctx *s) {   /* "." [0-9]{0,F-1} [1-9]: strictly above the integer part */
    gb *b = s->b;
    gb_seq q = {0};
    gb_byte(b, &q, '.');
    gb_repeat(b, &q, digit_rule(b, '0', '9'), 0, (uint32_t)s->o.max_frac - 1);
    gb_ref(b, &q, digit_rule(b, '1', '9'));
    return gb_rule_of(b, &q);
}

uint32_t gmr_number_rule(sctx *s, const bounds *bd) {
    gb *b = s->b;
    uint64_t lim = pow10u(s->o.max_digits) - 1;
    if (bd->lo == -INFINITY && bd->hi == INFINITY) {
        if (s->r_number != UINT32_MAX) return s->r_number;
        /* -? int frac? exp? */
        gb_seq q = {0};
        gb_repeat(b, &q, gmr_class_rule(b, "-", 0, 0), 0, 1);
        uint32_t ip = gb_rule_new(b);
        gb_define(b, ip);
        uint_range(b, ip, 0, lim);
        gb_ref(b, &q, ip);
        gb_seq f = {0};
        gb_byte(b, &f, '.');
        gb_repeat(b, &f, digit_rule(b, '0', '9'), 1, (uint32_t)s->o.max_frac);
        gb_repeat(b, &q, gb_rule_of(b, &f), 0, 1);
        gb_seq e = {0};
        gb_ref(b, &e, gmr_class_rule(b, "eE", 0, 0));
        gb_repeat(b, &e, gmr_class_rule(b, "+-", 0, 0), 0, 1);
        gb_repeat(b, &e, digit_rule(b, '0', '9'), 1, 3);
        gb_repeat(b, &q, gb_rule_of(b, &e), 0, 1);
        s->r_number = gb_rule_of(b, &q);
        return s->r_number;
    }
    uint32_t r = gb_rule_new(b);
    gb_define(b, r);
    /* plain integers within the bounds */
    bounds ib = *bd;
    uint32_t ir = gmr_integer_rule(s, &ib, false);   /* no integer: fractions may still fit */
    gb_seq q = {0};
    gb_ref(b, &q, ir);
    gb_alt(b, r, &q);   /* q, emptied by gb_alt, builds the next alternatives */
    bool any = false;
    /* I.F in (I, I+1): lo <= I and I + 1 <= hi */
    double L = bd->lo == -INFINITY ? 0 : fmax(0, ceil(bd->lo));
    double H = bd->hi == INFINITY ? (double)lim : fmin((double)lim, floor(bd->hi) - 1);
    if (L <= H) {
        uint32_t m = gb_rule_new(b);
        gb_define(b, m);
        uint_range(b, m, (uint64_t)L, (uint64_t)H);
        gb_ref(b, &q, m);
        gb_ref(b, &q, frac_rule(s));
        gb_alt(b, r, &q);
        any = true;
    }
    /* -I.F in (-(I+1), -I): I <= -lo - 1 and I >= -hi */
    L = bd->hi == INFINITY ? 0 : fmax(0, ceil(-bd->hi));
    H = bd->lo == -INFINITY ? (double)lim : fmin((double)lim, floor(-bd->lo) - 1);
    if (L <= H) {
        uint32_t m = gb_rule_new(b);
        gb_define(b, m);
        uint_range(b, m, (uint64_t)L, (uint64_t)H);
        gb_byte(b, &q, '-');
        gb_ref(b, &q, m);
        gb_ref(b, &q, frac_rule(s));
        gb_alt(b, r, &q);
        any = true;
    }
    if (!b->err && !any && (!b->rules[ir].n))
        gb_fail(b, KVS_ERR_UNSUPPORTED,
                "minimum/maximum: no number in the bounds can be written (narrower than one unit, no integer)");
    return r;
}

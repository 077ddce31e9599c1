// match.c: see match.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "host/eval/match.h"

#include <ctype.h>
#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

size_t eval_cut(const eval_item *it, const char *output) {
    size_t n = strlen(output);
    for (int i = 0; i < it->n_stop; i++) {
        const char *p = strstr(output, it->stop[i]);
        if (p && (size_t)(p - output) < n) n = (size_t)(p - output);
    }
    return n;
}

// The number starting at s[i] (a digit, or '-' before one): its text length, and its value in *v.
static size_t scan_number(const char *s, size_t len, size_t i, double *v) {
    size_t j = i + (s[i] == '-');
    char buf[128];
    size_t k = 0;
    if (s[i] == '-') buf[k++] = '-';
    while (j < len && k < sizeof buf - 2) {
        if (isdigit((unsigned char)s[j])) buf[k++] = s[j++];
        else if (s[j] == ',' && j + 3 < len && isdigit((unsigned char)s[j + 1]) &&
                 isdigit((unsigned char)s[j + 2]) && isdigit((unsigned char)s[j + 3]) &&
                 (j + 4 >= len || !isdigit((unsigned char)s[j + 4])))
            j++;  // a thousands separator: exactly three digits follow
        else break;
    }
    if (j + 1 < len && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
        buf[k++] = s[j++];
        while (j < len && isdigit((unsigned char)s[j]) && k < sizeof buf - 1) buf[k++] = s[j++];
    }
    buf[k] = 0;
    *v = strtod(buf, NULL);
    return j - i;
}

// The first or last number in s[0..len): its offset and length, -1 when there is none.
static long find_number(const char *s, size_t len, int last, size_t *n_out, double *v) {
    long found = -1;
    for (size_t i = 0; i < len;) {
        int starts = isdigit((unsigned char)s[i]) || (s[i] == '-' && i + 1 < len && isdigit((unsigned char)s[i + 1]));
        // a digit glued to a letter or a decimal point before it is not a number's start
        if (starts && i > 0 && (isalpha((unsigned char)s[i - 1]) || s[i - 1] == '.' || isdigit((unsigned char)s[i - 1])))
            starts = 0;
        if (!starts) {
            i++;
            continue;
        }
        double x;
        size_t n = scan_number(s, len, i, &x);
        found = (long)i, *n_out = n, *v = x;
        if (!last) return found;
        i += n;
    }
    return found;
}

int eval_number_value(const char *s, double *v) {
    while (isspace((unsigned char)*s)) s++;
    size_t len = strlen(s);
    while (len && isspace((unsigned char)s[len - 1])) len--;
    if (!len || !(isdigit((unsigned char)s[0]) || s[0] == '-')) return -1;
    size_t n = scan_number(s, len, 0, v);
    return n == len && n > (size_t)(s[0] == '-') ? 0 : -1;
}

static pcre2_code *compile(const char *pattern, int nocase, int *ec, PCRE2_SIZE *off) {
    uint32_t opt = PCRE2_UTF | (nocase ? PCRE2_CASELESS : 0);
#ifdef PCRE2_MATCH_INVALID_UTF
    opt |= PCRE2_MATCH_INVALID_UTF;  // outputs may end inside a UTF-8 sequence
#endif
    return pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opt, ec, off, NULL);
}

int eval_regex_check(const char *pattern, int nocase, verr *err) {
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re = compile(pattern, nocase, &ec, &off);
    if (re) return pcre2_code_free(re), 0;
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ec, msg, sizeof msg);
    return verr_set(err, "answer: bad regex at offset %zu: %s", (size_t)off, (const char *)msg);
}

static int regex_search(const char *pattern, int nocase, const char *s, size_t len) {
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re = compile(pattern, nocase, &ec, &off);
    if (!re) return 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = md ? pcre2_match(re, (PCRE2_SPTR)s, len, 0, 0, md, NULL) : -1;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static int contains(const char *s, size_t len, const char *needle, int nocase) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= len; i++)
        if (nocase ? !strncasecmp(s + i, needle, k) : !memcmp(s + i, needle, k)) return 1;
    return 0;
}

static void put(char *dst, size_t n, const char *s, size_t len) {
    if (!n) return;
    if (len >= n) len = n - 1;
    memcpy(dst, s, len);
    dst[len] = 0;
}

int eval_judge(const eval_item *it, const char *output, char *extracted, size_t n) {
    size_t len = eval_cut(it, output);
    put(extracted, n, "", 0);
    if (it->match == MATCH_NUMBER) {
        double x, want;
        size_t k = 0;
        long at = find_number(output, len, it->pick_last, &k, &x);
        if (at < 0 || eval_number_value(it->answer, &want)) return 0;
        put(extracted, n, output + at, k);
        return fabs(x - want) <= 1e-9 * fmax(1, fabs(want));
    }
    if (it->match == MATCH_REGEX) return regex_search(it->answer, it->nocase, output, len);
    if (it->match == MATCH_CONTAINS) return contains(output, len, it->answer, it->nocase);
    const char *b = output, *a = it->answer;
    while (len && isspace((unsigned char)*b)) b++, len--;
    while (len && isspace((unsigned char)b[len - 1])) len--;
    put(extracted, n, b, len);
    while (isspace((unsigned char)*a)) a++;
    size_t alen = strlen(a);
    while (alen && isspace((unsigned char)a[alen - 1])) alen--;
    if (alen != len) return 0;
    return it->nocase ? !strncasecmp(b, a, len) : !memcmp(b, a, len);
}

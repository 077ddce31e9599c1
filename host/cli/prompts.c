// prompts.c: see prompts.h.
#include "host/cli/prompts.h"
#include "host/cli/ranks.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "host/decode/chat_prompt.h"
#include "host/util/fileio.h"

void prompts_free(prompt_list *l) {
    for (int i = 0; i < l->n; i++) free(l->text[i]);
    free(l->text), free(l->line);
    memset(l, 0, sizeof *l);
}

// Appends a copy of s[0..len).
static int push(prompt_list *l, const char *s, size_t len, int line, verr *err) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        char **t = realloc(l->text, sizeof(char *) * (size_t)cap);
        if (t) l->text = t;
        int *ln = t ? realloc(l->line, sizeof(int) * (size_t)cap) : NULL;
        if (!ln) return verr_set(err, "out of memory");
        l->line = ln, l->cap = cap;
    }
    char *c = malloc(len + 1);
    if (!c) return verr_set(err, "out of memory");
    memcpy(c, s, len), c[len] = 0;
    l->text[l->n] = c, l->line[l->n++] = line;
    return 0;
}

static const char *skip_bom(const char *s) { return strncmp(s, "\xef\xbb\xbf", 3) ? s : s + 3; }

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isspace((unsigned char)s[i])) return 0;
    return 1;
}

int prompts_read_lines(prompt_list *l, const char *path, verr *err) {
    memset(l, 0, sizeof *l);
    char *buf = cli_read_all(path, err);
    if (!buf) return -1;
    int line = 1, rc = 0;
    for (const char *p = skip_bom(buf); rc == 0 && *p; line++) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        size_t k = n > 0 && p[n - 1] == '\r' ? n - 1 : n;
        if (!blank(p, k)) rc = push(l, p, k, line, err);
        p += nl ? n + 1 : n;
    }
    free(buf);
    if (rc == 0 && l->n == 0) rc = verr_set(err, "%s: no prompts (the file is empty or has only blank lines)", path);
    if (rc) prompts_free(l);
    return rc;
}

// One CSV field starting at *p (a quote or any other char); appends its unescaped
// bytes to out. Leaves *p at the delimiter (',', '\r', '\n' or NUL).
typedef struct {
    char *b;
    size_t n, cap;
} strbuf;

static int sb_put(strbuf *s, char c) {
    if (s->n + 1 >= s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        char *b = realloc(s->b, cap);
        if (!b) return -1;
        s->b = b, s->cap = cap;
    }
    s->b[s->n++] = c;
    s->b[s->n] = 0;
    return 0;
}

typedef struct {
    const char *p;
    int line;
    const char *where;
} csv_reader;

static int csv_field(csv_reader *r, strbuf *out, verr *err) {
    out->n = 0;
    if (sb_put(out, 0)) return verr_set(err, "out of memory");
    out->n = 0;
    if (*r->p != '"') {
        for (; *r->p && *r->p != ',' && *r->p != '\n' && !(r->p[0] == '\r' && r->p[1] == '\n'); r->p++)
            if (sb_put(out, *r->p)) return verr_set(err, "out of memory");
        return 0;
    }
    int start = r->line;
    for (r->p++;; r->p++) {
        if (!*r->p) return verr_set(err, "%s:%d: unterminated quoted field", r->where, start);
        if (*r->p == '"') {
            if (r->p[1] != '"') break;
            r->p++;
        }
        if (*r->p == '\n') r->line++;
        if (sb_put(out, *r->p)) return verr_set(err, "out of memory");
    }
    r->p++;  // the closing quote
    if (*r->p && *r->p != ',' && *r->p != '\n' && !(r->p[0] == '\r' && r->p[1] == '\n'))
        return verr_set(err, "%s:%d: unexpected '%c' after a closing quote (a quote inside a field is written \"\")",
                        r->where, r->line, *r->p);
    return 0;
}

// Reads one record's fields: calls fn for each (index, text). Returns the field count.
typedef int (*field_fn)(void *ud, int i, const strbuf *f, verr *err);

static int csv_record(csv_reader *r, strbuf *f, field_fn fn, void *ud, verr *err) {
    int i = 0;
    for (;; i++) {
        if (csv_field(r, f, err) || fn(ud, i, f, err)) return -1;
        if (*r->p != ',') break;
        r->p++;
    }
    if (*r->p == '\r') r->p++;
    if (*r->p == '\n') r->p++, r->line++;
    return i + 1;
}

static char *trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

typedef struct {
    int col, line;
    const char *where;
    prompt_list *l;
} csv_state;

static int header_field(void *ud, int i, const strbuf *f, verr *err) {
    csv_state *st = ud;
    char *name = trim(f->b);
    if (strcasecmp(name, "prompt") != 0) return 0;
    if (st->col >= 0) return verr_set(err, "%s:1: two columns are named prompt (%d and %d)", st->where, st->col + 1, i + 1);
    st->col = i;
    return 0;
}

static int row_field(void *ud, int i, const strbuf *f, verr *err) {
    csv_state *st = ud;
    if (i != st->col) return 0;
    if (blank(f->b, f->n)) return verr_set(err, "%s:%d: empty prompt", st->where, st->line);
    return push(st->l, f->b, f->n, st->line, err);
}

static int empty_line(const char *p) { return *p == '\n' || (p[0] == '\r' && p[1] == '\n'); }

int prompts_parse_csv(prompt_list *l, const char *text, const char *where, verr *err) {
    memset(l, 0, sizeof *l);
    csv_reader r = { skip_bom(text), 1, where };
    csv_state st = { -1, 1, where, l };
    strbuf f = { 0 };
    int rc = 0;
    while (empty_line(r.p)) r.p += *r.p == '\r' ? 2 : 1, r.line++;
    if (!*r.p) rc = verr_set(err, "%s: empty CSV file (it needs a header row with a prompt column)", where);
    int n_cols = rc ? -1 : csv_record(&r, &f, header_field, &st, err);
    if (n_cols < 0) rc = -1;
    else if (st.col < 0) rc = verr_set(err, "%s:1: the header has no column named prompt", where);
    while (rc == 0 && *r.p) {
        if (empty_line(r.p)) {
            r.p += *r.p == '\r' ? 2 : 1, r.line++;
            continue;
        }
        st.line = r.line;
        int n = csv_record(&r, &f, row_field, &st, err);
        if (n < 0) rc = -1;
        else if (n != n_cols)
            rc = verr_set(err, "%s:%d: the record has %d field%s but the header has %d", where, st.line, n,
                          n == 1 ? "" : "s", n_cols);
    }
    if (rc == 0 && l->n == 0) rc = verr_set(err, "%s: no prompts (only a header row)", where);
    free(f.b);
    if (rc) prompts_free(l);
    return rc;
}

int prompts_read_csv(prompt_list *l, const char *path, verr *err) {
    memset(l, 0, sizeof *l);
    char *buf = cli_read_all(path, err);
    if (!buf) return -1;
    int rc = prompts_parse_csv(l, buf, path, err);
    free(buf);
    return rc;
}

const cli_opt cli_opts_chat[] = {
    { "--chat", NULL, "chat", NULL, "the prompt is a user turn in the model's chat template", 0 },
    { "-sys|--system|--system-prompt", "TEXT", "chat", NULL, "system message (implies --chat)", 0 },
    { "--chat-template", "NAME", "chat", "the model's", "chat format instead of the detected one (implies --chat)", 0 },
    { "--no-think", NULL, "chat", NULL, "Qwen3: an empty thinking block, no reasoning (implies --chat)", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

void cli_check_template(args *a, const char *name) {
    chat_format f;
    verr err;
    if (name && chat_format_from_name(name, &f, &err)) args_bad(a, "--chat-template: %s", err.msg);
}

void prompt_style_read(args *a, prompt_style *ps) {
    ps->chat = args_flag(a, "--chat");
    ps->think = !args_flag(a, "--no-think");
    ps->system = args_str(a, "--system", NULL);
    ps->template_name = args_str(a, "--chat-template", NULL);
    cli_check_template(a, ps->template_name);
    ps->chat |= !ps->think || ps->system || ps->template_name;  // they only mean something in a chat prompt
}

const cli_opt cli_opts_raw[] = {
    { "--raw|-no-cnv|--no-conversation", NULL, "chat", NULL, "the prompt is plain text, even when the model has a chat "
      "template", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};

void prompt_style_read_raw(args *a, prompt_style *ps) { ps->raw = args_flag(a, "--raw"); }

int prompt_style_auto(const session *s, prompt_style *ps) {
    if (ps->chat || ps->raw || !s->tok) return 0;
    const char *t = tokenizer_chat_template(s->tok);
    if (!t || chat_detect(t).kind == CHAT_UNKNOWN) return 0;
    return ps->chat = 1;
}

int prompt_encode(session *s, const prompt_style *ps, const char *text, int **ids, verr *err) {
    if (!ps->chat) return session_encode_prompt(s, text, ids, err);
    if (!text) return verr_set(err, "--chat needs a user message with -p");
    chat_conv conv;
    int rc = chat_conv_init(&conv, s, ps->template_name, ps->think, err);
    if (rc == 0 && ps->system) rc = chat_conv_add(&conv, "system", ps->system, err);
    if (rc == 0) rc = chat_conv_add(&conv, "user", text, err);
    int n = rc == 0 ? chat_conv_ids(&conv, s, ids, err) : -1;
    chat_conv_free(&conv);
    return n;
}

int prompts_encode_all(session *s, const prompt_style *ps, const prompt_list *pl, const char *path, int **ids, int *n,
                       verr *err) {
    for (int i = 0; i < pl->n; i++) {
        n[i] = prompt_encode(s, ps, pl->text[i], &ids[i], err);
        if (n[i] < 0) return verr_set(err, "%s:%d: %.900s", path, pl->line[i], err->msg);
        if (n[i] >= s->ctx)
            return verr_set(err, "%s:%d: the prompt is %d tokens but the context holds %d (raise --ctx)", path,
                            pl->line[i], n[i], s->ctx);
    }
    return 0;
}

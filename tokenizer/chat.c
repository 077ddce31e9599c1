// chat.c: see chat.h. Each renderer mirrors the control flow of its Hugging Face
// template (including its whitespace trimming, which follows Python's str.strip), so
// the output equals what jinja2 produces under transformers for the same messages.
#include "tokenizer/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- growable output buffer ----

typedef struct {
    char *p;
    size_t n, cap;
    int oom;         // sticky: one check at the end instead of after every append
    size_t *spans;   // [2 * n_spans] byte ranges of message text (NULL: not recorded)
    int n_spans, cap_spans, record;
} sbuf;

static void sb_addn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_add(sbuf *b, const char *s) { sb_addn(b, s, strlen(s)); }

// Notes that [from, b->n) holds message text (escape_special: tokenized as plain text).
static void sb_mark(sbuf *b, size_t from) {
    if (!b->record || b->oom || from == b->n) return;
    if (b->n_spans == b->cap_spans) {
        int cap = b->cap_spans ? 2 * b->cap_spans : 16;
        size_t *p = realloc(b->spans, sizeof *p * 2 * (size_t)cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->spans = p;
        b->cap_spans = cap;
    }
    b->spans[2 * b->n_spans] = from;
    b->spans[2 * b->n_spans + 1] = b->n;
    b->n_spans++;
}

// ---- Python string helpers ----

// Decode one UTF-8 code point at s (n bytes left); *len gets its byte length.
// Malformed bytes decode as themselves, one byte long.
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0];
    int k = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (k == 0 || (size_t)k >= n) {
        *len = 1;
        return c;
    }
    uint32_t cp = c & (0x3F >> k);
    for (int i = 1; i <= k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return c;
        }
        cp = cp << 6 | (s[i] & 0x3F);
    }
    *len = (size_t)k + 1;
    return cp;
}

// Python's str.isspace() (the set str.strip() removes with no argument).
static int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

typedef struct {
    const char *p;
    size_t n;
} span;

static span sp(const char *s) { return (span){s, strlen(s)}; }

// str.strip(): Unicode whitespace from both ends (jinja's |trim does the same).
static span py_strip(span s) {
    const unsigned char *u = (const unsigned char *)s.p;
    size_t b = 0, e = s.n, len;
    while (b < e && py_isspace(utf8_at(u + b, e - b, &len))) b += len;
    while (e > b) {
        size_t st = e - 1;
        while (st > b && (u[st] & 0xC0) == 0x80 && e - st < 4) st--;
        if (!py_isspace(utf8_at(u + st, e - st, &len)) || st + len != e) break;
        e = st;
    }
    return (span){s.p + b, e - b};
}

static span lstrip_nl(span s) {
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}

static span rstrip_nl(span s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

// First / last occurrence of needle in s, or NULL.
static const char *span_find(span s, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= s.n; i++)
        if (memcmp(s.p + i, needle, k) == 0) return s.p + i;
    return NULL;
}

static const char *span_rfind(span s, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = s.n; i >= k; i--)
        if (memcmp(s.p + i - k, needle, k) == 0) return s.p + i - k;
    return NULL;
}

static void sb_span(sbuf *b, span s) { sb_addn(b, s.p, s.n); }

// Message text: appended and, when recording, marked.
static void sb_text(sbuf *b, span s) {
    size_t from = b->n;
    sb_span(b, s);
    sb_mark(b, from);
}

// json.dumps(s, ensure_ascii=False): transformers' tojson filter on a string.
static void sb_json_string(sbuf *b, const char *s) {
    sb_add(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        const char *e = NULL;
        switch (c) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                e = esc;
            }
        }
        if (e) sb_add(b, e);
        else sb_addn(b, s, 1);
    }
    sb_add(b, "\"");
}

static int is_role(const chat_msg *m, const char *role) { return strcmp(m->role, role) == 0; }

// ---- Llama 3 ----

static void llama3_header(sbuf *b, const char *role) {
    sb_add(b, "<|start_header_id|>");
    sb_add(b, role);
    sb_add(b, "<|end_header_id|>\n\n");
}

static void llama3_turn(sbuf *b, const char *role, const char *content) {
    llama3_header(b, role);
    sb_text(b, py_strip(sp(content)));
    sb_add(b, "<|eot_id|>");
}

// The "Today Date" value: explicit, today (3.2's strftime_now), or the fixed default.
static void llama3_date(const chat_format *f, const chat_opts *o, char *out, size_t cap) {
    if (o->date_string) {
        snprintf(out, cap, "%s", o->date_string);
        return;
    }
    time_t now = time(NULL);
    struct tm tm;
    if (f->date_today && localtime_r(&now, &tm) && strftime(out, cap, "%d %b %Y", &tm) > 0) return;
    snprintf(out, cap, "%s", f->default_date[0] ? f->default_date : "26 Jul 2024");
}

static void render_llama3(sbuf *b, const chat_format *f, const chat_msg *m, int n,
                          const chat_opts *o) {
    const char *bos = o->bos_token ? o->bos_token : "<|begin_of_text|>";
    if (!f->date_block) {  // Llama 3.0: every turn alike, BOS before the first
        sb_add(b, bos);
        for (int i = 0; i < n; i++) llama3_turn(b, m[i].role, m[i].content);
        if (o->add_generation_prompt || f->gen_prompt_always) llama3_header(b, "assistant");
        return;
    }
    char date[256];
    llama3_date(f, o, date, sizeof date);
    sb_add(b, bos);
    llama3_header(b, "system");
    sb_add(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    sb_add(b, date);
    sb_add(b, "\n\n");
    int start = 0;
    if (is_role(&m[0], "system")) {
        sb_text(b, py_strip(sp(m[0].content)));
        start = 1;
    }
    sb_add(b, "<|eot_id|>");
    for (int i = start; i < n; i++) {
        if (is_role(&m[i], "tool")) {  // tool output goes in an ipython turn, JSON-quoted
            llama3_header(b, "ipython");
            size_t from = b->n;
            sb_json_string(b, m[i].content);
            sb_mark(b, from);
            sb_add(b, "<|eot_id|>");
        } else {
            llama3_turn(b, m[i].role, m[i].content);
        }
    }
    if (o->add_generation_prompt) llama3_header(b, "assistant");
}

// ---- ChatML (Qwen2/2.5, SmolLM2) and Qwen3 ----

static void chatml_turn(sbuf *b, const char *role, span content) {
    sb_add(b, "<|im_start|>");
    sb_add(b, role);
    sb_add(b, "\n");
    sb_text(b, content);
    sb_add(b, "<|im_end|>\n");
}

// Consecutive tool turns share one user turn of <tool_response> blocks (Qwen).
static void chatml_tool(sbuf *b, const chat_msg *m, int n, int i) {
    if (i == 0 || !is_role(&m[i - 1], "tool")) sb_add(b, "<|im_start|>user");
    sb_add(b, "\n<tool_response>\n");
    sb_text(b, sp(m[i].content));
    sb_add(b, "\n</tool_response>");
    if (i == n - 1 || !is_role(&m[i + 1], "tool")) sb_add(b, "<|im_end|>\n");
}

static void render_chatml(sbuf *b, const chat_format *f, const chat_msg *m, int n,
                          const chat_opts *o) {
    int start = 0;
    if (is_role(&m[0], "system")) {
        chatml_turn(b, "system", sp(m[0].content));
        start = 1;
    } else if (f->has_default_system) {
        chatml_turn(b, "system", sp(f->default_system));
    }
    for (int i = start; i < n; i++) {
        if (is_role(&m[i], "tool") && f->tool_response) chatml_tool(b, m, n, i);
        else chatml_turn(b, m[i].role, sp(m[i].content));
    }
    if (o->add_generation_prompt) sb_add(b, "<|im_start|>assistant\n");
}

// Index of the last real user query: tool results wrapped as user turns don't count.
static int qwen3_last_query(const chat_msg *m, int n) {
    for (int i = n - 1; i >= 0; i--) {
        if (!is_role(&m[i], "user")) continue;
        span c = sp(m[i].content);
        int wrapped = c.n >= 15 && strncmp(c.p, "<tool_response>", 15) == 0 && c.n >= 16 &&
                      strcmp(c.p + c.n - 16, "</tool_response>") == 0;
        if (!wrapped) return i;
    }
    return n - 1;
}

// Split an assistant message into reasoning and answer as the Qwen3 template does:
// reasoning_content if given, else the text around "</think>" in the content.
static void qwen3_split(const chat_msg *msg, span *content, span *reasoning) {
    *content = sp(msg->content);
    *reasoning = sp("");
    if (msg->reasoning) {
        *reasoning = sp(msg->reasoning);
        return;
    }
    const char *first = span_find(*content, "</think>");
    if (!first) return;
    const char *last = span_rfind(*content, "</think>");
    span before = rstrip_nl((span){content->p, (size_t)(first - content->p)});
    const char *open = span_rfind(before, "<think>");
    if (open) before = (span){open + 7, (size_t)(before.p + before.n - open - 7)};
    *reasoning = lstrip_nl(before);
    const char *after = last + 8;
    *content = lstrip_nl((span){after, (size_t)(content->p + content->n - after)});
}

static void qwen3_assistant(sbuf *b, const chat_msg *m, int n, int i, int last_query) {
    span content, reasoning;
    qwen3_split(&m[i], &content, &reasoning);
    sb_add(b, "<|im_start|>assistant\n");
    // Reasoning is kept only after the last user query (the turn being continued).
    if (i > last_query && (i == n - 1 || reasoning.n)) {
        sb_add(b, "<think>\n");
        sb_text(b, lstrip_nl(rstrip_nl(reasoning)));
        sb_add(b, "\n</think>\n\n");
        sb_text(b, lstrip_nl(content));
    } else {
        sb_text(b, content);
    }
    sb_add(b, "<|im_end|>\n");
}

static void render_qwen3(sbuf *b, const chat_format *f, const chat_msg *m, int n,
                         const chat_opts *o) {
    (void)f;
    int start = 0;
    if (is_role(&m[0], "system")) {
        chatml_turn(b, "system", sp(m[0].content));
        start = 1;
    }
    int last_query = qwen3_last_query(m, n);
    for (int i = start; i < n; i++) {
        if (is_role(&m[i], "assistant")) qwen3_assistant(b, m, n, i, last_query);
        else if (is_role(&m[i], "tool")) chatml_tool(b, m, n, i);
        else chatml_turn(b, m[i].role, sp(m[i].content));
    }
    if (o->add_generation_prompt) {
        sb_add(b, "<|im_start|>assistant\n");
        if (!o->enable_thinking) sb_add(b, "<think>\n\n</think>\n\n");
    }
}

// ---- Llama 2 ----

static int render_llama2(sbuf *b, const chat_msg *m, int n, const chat_opts *o, verr *err) {
    const char *bos = o->bos_token ? o->bos_token : "<s>";
    const char *eos = o->eos_token ? o->eos_token : "</s>";
    const char *sys = NULL;
    int start = 0;
    if (is_role(&m[0], "system")) {
        sys = m[0].content;
        start = 1;
    }
    for (int j = 0; start + j < n; j++) {
        const chat_msg *msg = &m[start + j];
        if (is_role(msg, "user") != (j % 2 == 0))
            return verr_set(err, "chat llama2: message %d is '%s', but roles must alternate "
                                 "user/assistant/user/assistant/...", start + j, msg->role);
        sbuf content = {0};
        if (j == 0 && sys) {
            sb_add(&content, "<<SYS>>\n");
            sb_add(&content, sys);
            sb_add(&content, "\n<</SYS>>\n\n");
        }
        sb_add(&content, msg->content);
        if (content.oom) {
            free(content.p);
            return verr_set(err, "chat llama2: out of memory");
        }
        if (is_role(msg, "user")) {
            sb_add(b, bos);
            sb_add(b, "[INST] ");
            sb_text(b, py_strip((span){content.p, content.n}));
            sb_add(b, " [/INST]");
        } else if (is_role(msg, "assistant")) {
            sb_add(b, " ");
            sb_text(b, py_strip((span){content.p, content.n}));
            sb_add(b, " ");
            sb_add(b, eos);
        }
        free(content.p);
    }
    return 0;
}

// ---- detection ----

// Decode a jinja string literal from s up to the text `end`. Fails when the literal
// closes first (the text is not a constant) or uses an escape not handled here.
static int literal_until(const char *s, char quote, const char *end, char *out, size_t cap) {
    size_t n = 0, k = strlen(end);
    while (*s) {
        if (strncmp(s, end, k) == 0) {
            out[n] = 0;
            return 0;
        }
        char c = *s++;
        if (c == quote) return -1;
        if (c == '\\') {
            switch (*s++) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case '\\': c = '\\'; break;
            case '\'': c = '\''; break;
            case '"': c = '"'; break;
            default: return -1;
            }
        }
        if (n + 1 >= cap) return -1;
        out[n++] = c;
    }
    return -1;
}

// A ChatML default system prompt is a constant '<|im_start|>system\n...<|im_end|>'
// literal; the other system literals in a template concatenate messages[0].
static int chatml_default_system(const char *t, char *out, size_t cap) {
    const char *tag = "<|im_start|>system";
    for (const char *p = strstr(t, tag); p; p = strstr(p + 1, tag)) {
        const char *q = p;
        while (q > t && q[-1] != '\'' && q[-1] != '"') q--;
        if (q == t) continue;
        const char *s = p + strlen(tag);
        if (strncmp(s, "\\n", 2) == 0) s += 2;
        else if (*s == '\n') s += 1;
        else continue;
        if (literal_until(s, q[-1], "<|im_end|>", out, cap) == 0) return 1;
    }
    return 0;
}

// Llama 3.1's `set date_string = "26 Jul 2024"` fallback.
static void llama3_default_date(const char *t, char *out, size_t cap) {
    snprintf(out, cap, "26 Jul 2024");
    const char *p = strstr(t, "date_string = ");
    if (!p) return;
    p += strlen("date_string = ");
    if (*p != '"' && *p != '\'') return;
    const char *e = strchr(p + 1, *p);
    if (e && (size_t)(e - p - 1) < cap) snprintf(out, cap, "%.*s", (int)(e - p - 1), p + 1);
}

chat_format chat_detect(const char *t) {
    chat_format f;
    memset(&f, 0, sizeof f);
    if (!t) return f;
    if (strstr(t, "<|start_header_id|>")) {
        f.kind = CHAT_LLAMA3;
        f.date_block = strstr(t, "Cutting Knowledge Date") != NULL;
        f.date_today = f.date_block && strstr(t, "strftime_now") != NULL;
        llama3_default_date(t, f.default_date, sizeof f.default_date);
        f.gen_prompt_always = strstr(t, "add_generation_prompt") == NULL;
    } else if (strstr(t, "<|im_start|>")) {
        int think = strstr(t, "<think>") || strstr(t, "enable_thinking");
        f.kind = think ? CHAT_QWEN3 : CHAT_CHATML;
        f.tool_response = strstr(t, "<tool_response>") != NULL;
        if (!think)
            f.has_default_system = chatml_default_system(t, f.default_system, sizeof f.default_system);
    } else if (strstr(t, "[INST]") && strstr(t, "<<SYS>>")) {
        f.kind = CHAT_LLAMA2;
    }
    return f;
}

#define QWEN_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define SMOLLM_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
#define CHAT_NAMES "llama3, llama3.1, llama3.2, chatml, qwen2.5, smollm2, qwen3, llama2"

int chat_format_from_name(const char *name, chat_format *f, verr *err) {
    memset(f, 0, sizeof *f);
    snprintf(f->default_date, sizeof f->default_date, "26 Jul 2024");
    const char *sys = NULL;
    if (!strcmp(name, "llama3")) f->kind = CHAT_LLAMA3;
    else if (!strcmp(name, "llama3.1")) f->kind = CHAT_LLAMA3, f->date_block = 1;
    else if (!strcmp(name, "llama3.2")) f->kind = CHAT_LLAMA3, f->date_block = 1, f->date_today = 1;
    else if (!strcmp(name, "chatml")) f->kind = CHAT_CHATML;
    else if (!strcmp(name, "qwen2.5") || !strcmp(name, "qwen2"))
        f->kind = CHAT_CHATML, f->tool_response = 1, sys = QWEN_SYSTEM;
    else if (!strcmp(name, "smollm2")) f->kind = CHAT_CHATML, sys = SMOLLM_SYSTEM;
    else if (!strcmp(name, "qwen3")) f->kind = CHAT_QWEN3, f->tool_response = 1;
    else if (!strcmp(name, "llama2")) f->kind = CHAT_LLAMA2;
    else return verr_set(err, "unknown chat template name '%s' (known: " CHAT_NAMES ")", name);
    if (sys) {
        f->has_default_system = 1;
        snprintf(f->default_system, sizeof f->default_system, "%s", sys);
    }
    return 0;
}

chat_kind chat_kind_from_name(const char *name) {
    chat_format f;
    return chat_format_from_name(name, &f, NULL) ? CHAT_UNKNOWN : f.kind;
}

const char *chat_kind_name(chat_kind k) {
    switch (k) {
    case CHAT_LLAMA3: return "llama3";
    case CHAT_CHATML: return "chatml";
    case CHAT_QWEN3: return "qwen3";
    case CHAT_LLAMA2: return "llama2";
    default: return "unknown";
    }
}

// ---- public API ----

chat_opts chat_opts_default(void) {
    return (chat_opts){.add_generation_prompt = 1, .enable_thinking = 1};
}

static int check_messages(const chat_msg *m, int n, verr *err) {
    if (n <= 0) return verr_set(err, "chat: no messages to render");
    static const char *roles[] = {"system", "user", "assistant", "tool"};
    for (int i = 0; i < n; i++) {
        if (!m[i].role || !m[i].content)
            return verr_set(err, "chat: message %d has no %s", i, m[i].role ? "content" : "role");
        int ok = 0;
        for (size_t r = 0; r < sizeof roles / sizeof *roles; r++) ok |= strcmp(m[i].role, roles[r]) == 0;
        if (!ok)
            return verr_set(err, "chat: message %d has unknown role '%s' (expected system, user, "
                                 "assistant or tool)", i, m[i].role);
    }
    return 0;
}

char *chat_render(const chat_format *f, const chat_msg *msgs, int n, const chat_opts *opts,
                  verr *err) {
    return chat_render_spans(f, msgs, n, opts, NULL, NULL, err);
}

char *chat_render_spans(const chat_format *f, const chat_msg *msgs, int n, const chat_opts *opts,
                        size_t **spans, int *n_spans, verr *err) {
    if (spans) {
        *spans = NULL;
        *n_spans = 0;
    }
    if (check_messages(msgs, n, err)) return NULL;
    chat_opts def = chat_opts_default();
    const chat_opts *o = opts ? opts : &def;
    sbuf b = {0};
    b.record = spans != NULL;
    switch (f->kind) {
    case CHAT_LLAMA3: render_llama3(&b, f, msgs, n, o); break;
    case CHAT_CHATML: render_chatml(&b, f, msgs, n, o); break;
    case CHAT_QWEN3: render_qwen3(&b, f, msgs, n, o); break;
    case CHAT_LLAMA2:
        if (render_llama2(&b, msgs, n, o, err)) {
            free(b.p);
            free(b.spans);
            return NULL;
        }
        break;
    default: verr_set(err, "chat: no chat format selected"); return NULL;
    }
    if (b.oom) {
        free(b.p);
        free(b.spans);
        verr_set(err, "chat: out of memory rendering %d messages", n);
        return NULL;
    }
    if (!b.p) {  // nothing rendered (Llama 2 with only a system message)
        b.p = calloc(1, 1);
        if (!b.p) verr_set(err, "chat: out of memory");
    }
    if (spans && b.p) {
        *spans = b.spans;
        *n_spans = b.n_spans;
    } else {
        free(b.spans);
    }
    return b.p;
}

const char *const *chat_stop_strings(chat_kind k) {
    static const char *const llama3[] = {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", NULL};
    static const char *const chatml[] = {"<|im_end|>", "<|endoftext|>", NULL};
    static const char *const llama2[] = {"</s>", NULL};
    static const char *const none[] = {NULL};
    switch (k) {
    case CHAT_LLAMA3: return llama3;
    case CHAT_CHATML:
    case CHAT_QWEN3: return chatml;
    case CHAT_LLAMA2: return llama2;
    default: return none;
    }
}

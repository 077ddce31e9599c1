// request.c: see request.h. Unknown fields are ignored (clients send
// extras such as "user"); known ones are type- and range-checked.
#include "host/serve/request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode/entropix.h"
#include "host/decode/generate.h"

// Records the failing field and kind, and the message.
static int bad(server_request *r, verr *err, server_err_kind kind, const char *param, const char *fmt, const char *a) {
    r->kind = kind;
    snprintf(r->param, sizeof r->param, "%s", param);
    return verr_set(err, fmt, param, a ? a : "");
}

static const char *type_name(const cJSON *v) {
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    return "an object";
}

static int bad_type(server_request *r, verr *err, const char *param, const cJSON *v, const char *want) {
    char msg[128];
    snprintf(msg, sizeof msg, "%s, not %s", want, type_name(v));
    return bad(r, err, SRV_E_TYPE, param, "'%s' must be %s", msg);
}

// The field, or NULL when absent or null (both mean "use the default").
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(v) ? NULL : v;
}

static int get_number(server_request *r, const cJSON *o, const char *name, double lo, double hi, double *out,
                       verr *err) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad_type(r, err, name, v, "a number");
    char range[96];
    snprintf(range, sizeof range, "%g..%g", lo, hi);
    if (!isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return bad(r, err, SRV_E_VALUE, name, "'%s' must be in %s", range);
    *out = v->valuedouble;
    return 0;
}

static int get_int(server_request *r, const cJSON *o, const char *name, double lo, double hi, int64_t *out,
                   verr *err) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) return bad_type(r, err, name, v, "an integer");
    char range[96];
    snprintf(range, sizeof range, "%.0f..%.0f", lo, hi);
    if (v->valuedouble < lo || v->valuedouble > hi) return bad(r, err, SRV_E_VALUE, name, "'%s' must be in %s", range);
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int get_bool(server_request *r, const cJSON *o, const char *name, int *out, verr *err) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad_type(r, err, name, v, "a boolean");
    *out = cJSON_IsTrue(v);
    return 0;
}

static int dup_str(char **dst, const char *s, server_request *r, verr *err) {
    *dst = strdup(s);
    return *dst ? 0 : bad(r, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
}

// "prompt": a string, [string], [id, ...] or [[id, ...]].
static int parse_ids(server_request *r, const cJSON *arr, verr *err) {
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return bad(r, err, SRV_E_VALUE, "prompt", "'%s' is an empty array%s", NULL);
    if (n > SERVER_MAX_PROMPT_IDS) return bad(r, err, SRV_E_VALUE, "prompt", "'%s' has too many token ids%s", NULL);
    r->prompt_ids = malloc(sizeof(int) * (size_t)n);
    if (!r->prompt_ids) return bad(r, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble > 0x7fffffff)
            return bad(r, err, SRV_E_TYPE, "prompt", "'%s' must be a string or an array of token ids (integers >= 0)%s",
                       NULL);
        r->prompt_ids[r->n_prompt_ids++] = (int)e->valuedouble;
    }
    return 0;
}

static int parse_prompt(server_request *r, const cJSON *o, verr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!v) return bad(r, err, SRV_E_MISSING, "prompt", "'%s' is required%s", NULL);
    if (cJSON_IsString(v)) return dup_str(&r->prompt, v->valuestring, r, err);
    if (!cJSON_IsArray(v)) return bad_type(r, err, "prompt", v, "a string or an array of token ids");
    const cJSON *first = v->child;
    if (first && (cJSON_IsString(first) || cJSON_IsArray(first))) {
        if (cJSON_GetArraySize(v) != 1)
            return bad(r, err, SRV_E_UNSUPPORTED, "prompt", "'%s': batched prompts are not supported; send one per request%s",
                       NULL);
        if (cJSON_IsString(first)) return dup_str(&r->prompt, first->valuestring, r, err);
        return parse_ids(r, first, err);
    }
    return parse_ids(r, v, err);
}

// Message content: a string, null (""), or an array of {"type":"text","text":...} parts.
static int content_text(server_request *r, const cJSON *c, char **out, verr *err) {
    if (!c || cJSON_IsNull(c)) return dup_str(out, "", r, err);
    if (cJSON_IsString(c)) return dup_str(out, c->valuestring, r, err);
    if (!cJSON_IsArray(c)) return bad_type(r, err, "messages", c, "content as a string or an array of text parts");
    size_t len = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsObject(p) || !cJSON_IsString(t))
            return bad(r, err, SRV_E_TYPE, "messages", "'%s': each content part must be {\"type\":\"text\",\"text\":...}%s",
                       NULL);
        len += strlen(t->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) return bad(r, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
    size_t at = 0;
    cJSON_ArrayForEach(p, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
        size_t n = strlen(t);
        memcpy(s + at, t, n), at += n;
    }
    s[at] = 0;
    *out = s;
    return 0;
}

static int parse_messages(server_request *r, const cJSON *o, verr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!v) return bad(r, err, SRV_E_MISSING, "messages", "'%s' is required%s", NULL);
    if (!cJSON_IsArray(v)) return bad_type(r, err, "messages", v, "an array of messages");
    int n = cJSON_GetArraySize(v);
    if (n == 0) return bad(r, err, SRV_E_VALUE, "messages", "'%s' must hold at least one message%s", NULL);
    if (n > SERVER_MAX_MESSAGES) return bad(r, err, SRV_E_VALUE, "messages", "'%s' has too many messages%s", NULL);
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs) return bad(r, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
    const cJSON *m;
    cJSON_ArrayForEach(m, v) {
        const cJSON *role = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
        if (!cJSON_IsObject(m)) return bad_type(r, err, "messages", m, "an array of objects");
        if (!cJSON_IsString(role))
            return bad(r, err, SRV_E_TYPE, "messages", "'%s': each message needs a string \"role\"%s", NULL);
        const char *name = role->valuestring;
        if (!strcmp(name, "developer")) name = "system";  // OpenAI's newer name for it
        if (strcmp(name, "system") && strcmp(name, "user") && strcmp(name, "assistant") && strcmp(name, "tool"))
            return bad(r, err, SRV_E_VALUE, "messages", "'%s': unknown role '%s' (system, user, assistant, tool)", name);
        server_msg *dst = &r->msgs[r->n_msgs++];
        if (dup_str(&dst->role, name, r, err) ||
            content_text(r, cJSON_GetObjectItemCaseSensitive(m, "content"), &dst->content, err))
            return -1;
    }
    return 0;
}

static int parse_stop(server_request *r, const cJSON *o, verr *err) {
    const cJSON *v = field(o, "stop");
    if (!v) return 0;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) return bad_type(r, err, "stop", v, "a string or an array of strings");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > SERVER_MAX_STOP)
        return bad(r, err, SRV_E_VALUE, "stop", "'%s' takes at most 4 strings%s", NULL);
    const cJSON *e = cJSON_IsString(v) ? v : v->child;
    for (; e; e = cJSON_IsString(v) ? NULL : e->next) {
        if (!cJSON_IsString(e)) return bad_type(r, err, "stop", e, "a string or an array of strings");
        size_t n = strlen(e->valuestring);
        if (n == 0 || n > SERVER_MAX_STOP_LEN)
            return bad(r, err, SRV_E_VALUE, "stop", "'%s': each stop string must be 1..256 bytes%s", NULL);
        if (dup_str(&r->stop[r->n_stop++], e->valuestring, r, err)) return -1;
    }
    return 0;
}

static int parse_sampler(server_request *r, const cJSON *o, verr *err) {
    const cJSON *v = field(o, "sampler"), *p = field(o, "profile");
    if (v) {
        if (!cJSON_IsString(v)) return bad_type(r, err, "sampler", v, "a string");
        if (strcmp(v->valuestring, "standard") && strcmp(v->valuestring, "entropix"))
            return bad(r, err, SRV_E_VALUE, "sampler", "'%s' must be \"standard\" or \"entropix\", not '%s'",
                       v->valuestring);
        r->sampler = strcmp(v->valuestring, "entropix") ? GEN_STANDARD : GEN_ENTROPIX;
    }
    if (p) {
        if (!cJSON_IsString(p)) return bad_type(r, err, "profile", p, "a string");
        entropix_config c;
        if (strlen(p->valuestring) >= sizeof r->profile || entropix_profile(p->valuestring, &c, NULL))
            return bad(r, err, SRV_E_VALUE, "profile", "'%s': unknown profile (%s)", entropix_profile_names());
        snprintf(r->profile, sizeof r->profile, "%s", p->valuestring);
    }
    return 0;
}

// logprobs: completions take an integer (alternatives, 0..20); chat takes a boolean
// plus top_logprobs.
static int parse_logprobs(server_request *r, const cJSON *o, verr *err) {
    int64_t k = -1;
    if (!r->chat) {
        const cJSON *v = field(o, "logprobs");
        if (cJSON_IsBool(v)) r->logprobs = cJSON_IsTrue(v);  // lenient: true means the token's own logprob
        else if (get_int(r, o, "logprobs", 0, SERVER_MAX_TOP_LOGPROBS, &k, err)) return -1;
        if (k >= 0) r->logprobs = 1, r->top_logprobs = (int)k;
        return 0;
    }
    if (get_bool(r, o, "logprobs", &r->logprobs, err) ||
        get_int(r, o, "top_logprobs", 0, SERVER_MAX_TOP_LOGPROBS, &k, err))
        return -1;
    if (k > 0 && !r->logprobs)
        return bad(r, err, SRV_E_VALUE, "top_logprobs", "'%s' needs \"logprobs\": true%s", NULL);
    if (k >= 0) r->top_logprobs = (int)k;
    return 0;
}

static int parse_fields(server_request *r, const cJSON *o, verr *err) {
    const cJSON *m = field(o, "model"), *so = field(o, "stream_options");
    if (m && !cJSON_IsString(m)) return bad_type(r, err, "model", m, "a string");
    if (m && dup_str(&r->model, m->valuestring, r, err)) return -1;
    if (r->chat ? parse_messages(r, o, err) : parse_prompt(r, o, err)) return -1;
    int64_t max_tokens = -1, top_k = 0, n = 1, seed = -1;
    const char *max_name = r->chat && field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (get_int(r, o, max_name, 1, 0x7fffffff, &max_tokens, err) ||
        get_number(r, o, "temperature", 0, 100, &r->temperature, err) ||
        get_number(r, o, "top_p", 1e-9, 1, &r->top_p, err) || get_number(r, o, "min_p", 0, 0.999999, &r->min_p, err) ||
        get_int(r, o, "top_k", 0, 0x7fffffff, &top_k, err) || get_int(r, o, "n", 1, SERVER_MAX_N, &n, err) ||
        get_int(r, o, "seed", 0, 9007199254740992.0, &seed, err) || parse_stop(r, o, err) ||
        get_bool(r, o, "stream", &r->stream, err) || parse_sampler(r, o, err) || parse_logprobs(r, o, err) ||
        get_bool(r, o, "metrics", &r->metrics, err) || get_bool(r, o, "escape_special", &r->escape_special, err))
        return -1;
    if (so && !cJSON_IsObject(so)) return bad_type(r, err, "stream_options", so, "an object");
    if (so && get_bool(r, so, "include_usage", &r->include_usage, err)) return -1;
    r->max_tokens = (int)max_tokens, r->top_k = (int)top_k, r->n = (int)n;
    r->has_seed = seed >= 0, r->seed = seed >= 0 ? (uint64_t)seed : 0;
    return 0;
}

// Where a JSON path is while scanning: an object (its current key) or an array (its index).
typedef struct {
    int array, index;
    char key[48];
} json_level;

static void json_path(const json_level *st, int depth, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < depth && n < cap; i++)
        n += st[i].array ? (size_t)snprintf(out + n, cap - n, "[%d]", st[i].index)
                         : (size_t)snprintf(out + n, cap - n, i ? ".%s" : "%s", st[i].key);
}

// An escaped NUL ("\u0000") in any string of a valid JSON text would be cut short by
// cJSON's C strings, silently: finds the first and writes the field it is in
// ("messages[1].content") to path. 1 when found. Levels deeper than 16 are not named.
static int find_escaped_nul(const char *s, char *path, size_t cap) {
    json_level st[16];
    int depth = 0, expect_key = 0;
    for (const char *p = s; *p; p++) {
        json_level *top = depth > 0 && depth <= 16 ? &st[depth - 1] : NULL;
        if (*p == '{' || *p == '[') {
            if (depth < 16) st[depth] = (json_level){ *p == '[', 0, "" };
            depth++, expect_key = *p == '{';
        } else if (*p == '}' || *p == ']') {
            depth--;
        } else if (*p == ',') {
            if (top && top->array) top->index++;
            expect_key = top && !top->array;
        } else if (*p == '"') {
            const char *start = ++p;
            for (; *p != '"'; p++) {
                if (*p != '\\') continue;
                if (!strncmp(p + 1, "u0000", 5)) {  // in a key: the object that holds it
                    json_path(st, (depth < 16 ? depth : 16) - (expect_key && top), path, cap);
                    if (!path[0]) snprintf(path, cap, "(a key)");
                    return 1;
                }
                p++;  // the escaped character
            }
            if (expect_key && top) snprintf(top->key, sizeof top->key, "%.*s", (int)(p - start), start);
            expect_key = 0;
        }
    }
    return 0;
}

int server_parse_request(const char *body, size_t len, int chat, server_request *out, verr *err) {
    memset(out, 0, sizeof *out);
    out->chat = chat, out->max_tokens = -1, out->temperature = 1, out->top_p = 1, out->n = 1;
    out->sampler = -1, out->metrics = 1, out->escape_special = -1;
    // NUL-terminated copy: cJSON's length-limited parse cannot reject trailing bytes.
    char *buf = malloc(len + 1);
    if (!buf) return bad(out, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
    if (len) memcpy(buf, body, len);
    buf[len] = 0;
    const char *end = NULL;
    char nul_path[64];
    cJSON *root = strlen(buf) == len ? cJSON_ParseWithOpts(buf, &end, 1) : NULL;
    int rc;
    if (!root) {
        char where[64];
        snprintf(where, sizeof where, "%ld", strlen(buf) != len ? (long)strlen(buf) : end ? (long)(end - buf) : 0L);
        rc = bad(out, err, SRV_E_JSON, "", "the body is not valid JSON%s (near byte %s)", where);
    } else if (!cJSON_IsObject(root)) {
        rc = bad(out, err, SRV_E_JSON, "", "the body must be a JSON object%s%s", NULL);
    } else if (find_escaped_nul(buf, nul_path, sizeof nul_path)) {
        rc = bad(out, err, SRV_E_VALUE, nul_path, "'%s' holds a NUL character (\\u0000), which varent cannot pass on%s",
                 NULL);
    } else {
        rc = parse_fields(out, root, err);
    }
    cJSON_Delete(root);
    free(buf);
    if (rc) {
        server_err_kind kind = out->kind;
        char param[sizeof out->param];
        memcpy(param, out->param, sizeof param);
        server_request_free(out);
        out->kind = kind;
        memcpy(out->param, param, sizeof param);
    }
    return rc;
}

void server_request_free(server_request *r) {
    free(r->model), free(r->prompt), free(r->prompt_ids);
    for (int i = 0; i < r->n_msgs; i++) free(r->msgs[i].role), free(r->msgs[i].content);
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

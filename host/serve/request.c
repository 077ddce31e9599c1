// request.c: see request.h. Every field is type- and range-checked; a field the
// endpoint does not know is an error naming it, except OpenAI's fields that change
// nothing here (no_effect_fields), so a typo or an unsupported option never passes
// silently.
#include "host/serve/request.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/decode/defaults.h"
#include "host/decode/entropix.h"
#include "host/decode/generate.h"
#include "host/util/json_in.h"

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

// One prompt's token ids (an array of integers >= 0) into p; *total counts the ids of
// every prompt so far against SERVER_MAX_PROMPT_IDS.
static int parse_ids(server_request *r, const cJSON *arr, server_prompt *p, long *total, verr *err) {
    int n = cJSON_GetArraySize(arr);
    if (n == 0) return bad(r, err, SRV_E_VALUE, "prompt", "'%s' holds an empty array of token ids%s", NULL);
    if ((*total += n) > SERVER_MAX_PROMPT_IDS)
        return bad(r, err, SRV_E_VALUE, "prompt", "'%s' has too many token ids (1048576 in all)%s", NULL);
    p->ids = malloc(sizeof(int) * (size_t)n);
    if (!p->ids) return bad(r, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble > 0x7fffffff)
            return bad(r, err, SRV_E_TYPE, "prompt",
                       "'%s' must be a string, an array of token ids (integers >= 0), or an array of those%s", NULL);
        p->ids[p->n_ids++] = (int)e->valuedouble;
    }
    return 0;
}

// "prompt": a string, token ids [id, ...], or a list of prompts [string | [id, ...], ...]
// (OpenAI's batched form: one choice per prompt and n).
static int parse_prompt(server_request *r, const cJSON *o, verr *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (!v) return bad(r, err, SRV_E_MISSING, "prompt", "'%s' is required%s", NULL);
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) return bad_type(r, err, "prompt", v, "a string or an array of token ids");
    const cJSON *first = cJSON_IsArray(v) ? v->child : NULL;
    int list = first && (cJSON_IsString(first) || cJSON_IsArray(first));
    int n = list ? cJSON_GetArraySize(v) : 1;
    if (n > SERVER_MAX_PROMPTS) return bad(r, err, SRV_E_VALUE, "prompt", "'%s' holds more than 4096 prompts%s", NULL);
    r->prompts = calloc((size_t)n, sizeof *r->prompts);
    if (!r->prompts) return bad(r, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
    long total = 0;
    const cJSON *e = list ? first : v;
    for (; r->n_prompts < n; e = e->next) {
        server_prompt *p = &r->prompts[r->n_prompts++];
        if (cJSON_IsString(e)) {
            if (dup_str(&p->text, e->valuestring, r, err)) return -1;
        } else if (cJSON_IsArray(e) && (!list || !e->child || !cJSON_IsArray(e->child))) {
            if (parse_ids(r, e, p, &total, err)) return -1;
        } else {
            return bad(r, err, SRV_E_TYPE, "prompt",
                       "'%s' must be a string, an array of token ids, or an array of strings and token-id arrays%s", NULL);
        }
    }
    return 0;
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

// "stop": a string or an array of them, any number, SERVER_MAX_STOP_BYTES in all.
static int parse_stop(server_request *r, const cJSON *o, verr *err) {
    const cJSON *v = field(o, "stop");
    if (!v) return 0;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) return bad_type(r, err, "stop", v, "a string or an array of strings");
    int n = cJSON_IsString(v) ? 1 : cJSON_GetArraySize(v);
    size_t total = 0;
    r->stop = calloc((size_t)(n ? n : 1), sizeof *r->stop);
    if (!r->stop) return bad(r, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
    const cJSON *e = cJSON_IsString(v) ? v : v->child;
    for (; e; e = cJSON_IsString(v) ? NULL : e->next) {
        if (!cJSON_IsString(e)) return bad_type(r, err, "stop", e, "a string or an array of strings");
        size_t len = strlen(e->valuestring);
        if (len == 0) return bad(r, err, SRV_E_VALUE, "stop", "'%s': a stop string may not be empty%s", NULL);
        if ((total += len) > SERVER_MAX_STOP_BYTES)
            return bad(r, err, SRV_E_VALUE, "stop", "'%s': the stop strings hold more than 4096 bytes in all%s", NULL);
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

// "logit_bias": {"<token id>": bias in -100..100, ...}.
static int parse_logit_bias(server_request *r, const cJSON *o, verr *err) {
    const cJSON *v = field(o, "logit_bias"), *e;
    if (!v) return 0;
    if (!cJSON_IsObject(v)) return bad_type(r, err, "logit_bias", v, "an object of token ids to numbers");
    int n = cJSON_GetArraySize(v);
    if (n > SERVER_MAX_LOGIT_BIAS) return bad(r, err, SRV_E_VALUE, "logit_bias", "'%s' holds more than 2048 entries%s", NULL);
    r->bias = malloc(sizeof *r->bias * (size_t)(n ? n : 1));
    if (!r->bias) return bad(r, err, SRV_E_VALUE, "", "out of memory%s%s", NULL);
    cJSON_ArrayForEach(e, v) {
        const char *k = e->string;
        char *end;
        long id = k[0] >= '0' && k[0] <= '9' && strlen(k) <= 10 ? strtol(k, &end, 10) : -1;
        if (id < 0 || *end || id > 0x7fffffff)
            return bad(r, err, SRV_E_VALUE, "logit_bias", "'%s': key '%.40s' is not a token id (a decimal integer)", k);
        if (!cJSON_IsNumber(e)) return bad_type(r, err, "logit_bias", e, "an object of token ids to numbers");
        if (!isfinite(e->valuedouble) || fabs(e->valuedouble) > LOGIT_BIAS_MAX)
            return bad(r, err, SRV_E_VALUE, "logit_bias", "'%s': the bias of token %s must be in -100..100", k);
        r->bias[r->n_bias++] = (logit_bias){ (int)id, (float)e->valuedouble };
    }
    return 0;
}

// Fields each endpoint reads (1: completions, 2: chat, 3: both).
static const struct {
    const char *name;
    int where;
} known_fields[] = {
    { "model", 3 }, { "prompt", 1 }, { "messages", 2 }, { "max_tokens", 3 }, { "max_completion_tokens", 2 },
    { "temperature", 3 }, { "top_p", 3 }, { "top_k", 3 }, { "min_p", 3 }, { "seed", 3 }, { "stop", 3 }, { "n", 3 },
    { "stream", 3 }, { "stream_options", 3 }, { "sampler", 3 }, { "profile", 3 }, { "logprobs", 3 },
    { "top_logprobs", 2 }, { "metrics", 3 }, { "escape_special", 3 }, { "echo", 1 }, { "logit_bias", 3 },
    { "presence_penalty", 3 }, { "frequency_penalty", 3 }, { "repeat_penalty", 3 }, { "repeat_last_n", 3 },
};

// OpenAI fields accepted because they change nothing here: any value of the first
// group (bookkeeping), only the neutral value of the second (docs/server.md).
static const char *const no_effect_any[] = { "user", "store", "metadata", "service_tier" };

static int neutral_field(server_request *r, const cJSON *o, const char *name, verr *err) {
    const cJSON *v = field(o, name);
    const char *want = NULL;
    if (!strcmp(name, "best_of")) {
        if (!v || (cJSON_IsNumber(v) && v->valuedouble == 1)) return 0;
        want = "1";
    } else if (!strcmp(name, "suffix")) {
        if (!v || (cJSON_IsString(v) && !v->valuestring[0])) return 0;
        want = "null or \"\"";
    } else if (!strcmp(name, "tools")) {
        if (!v || (cJSON_IsArray(v) && !v->child)) return 0;
        want = "[]";
    } else if (!strcmp(name, "tool_choice")) {
        if (!v || (cJSON_IsString(v) && !strcmp(v->valuestring, "none"))) return 0;
        want = "\"none\"";
    } else {  // response_format
        const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
        if (!v || (cJSON_IsString(t) && !strcmp(t->valuestring, "text") && cJSON_GetArraySize(v) == 1)) return 0;
        want = "{\"type\":\"text\"}";
    }
    return bad(r, err, SRV_E_UNSUPPORTED, name, "'%s' is not implemented by varent; it is accepted only as %s", want);
}

static const struct {
    const char *name;
    int where;
} no_effect_neutral[] = {
    { "best_of", 1 }, { "suffix", 1 },
    { "tools", 2 }, { "tool_choice", 2 }, { "response_format", 2 },
};

#define N_OF(a) ((int)(sizeof(a) / sizeof *(a)))

// Every top-level field must be one the endpoint reads or an accepted no-op.
static int check_field_names(server_request *r, const cJSON *o, verr *err) {
    int bit = r->chat ? 2 : 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, o) {
        const char *k = e->string;
        int ok = 0;
        for (int i = 0; i < N_OF(known_fields) && !ok; i++) ok = (known_fields[i].where & bit) && !strcmp(k, known_fields[i].name);
        for (int i = 0; i < N_OF(no_effect_any) && !ok; i++) ok = !strcmp(k, no_effect_any[i]);
        for (int i = 0; i < N_OF(no_effect_neutral) && !ok; i++)
            if ((no_effect_neutral[i].where & bit) && !strcmp(k, no_effect_neutral[i].name)) {
                if (neutral_field(r, o, k, err)) return -1;
                ok = 1;
            }
        if (!ok) {
            char name[sizeof r->param];
            snprintf(name, sizeof name, "%.*s", (int)sizeof name - 1, k);
            return bad(r, err, SRV_E_UNKNOWN, name, "'%s' is not a field of %s (see docs/server.md, Request fields)",
                       r->chat ? "/v1/chat/completions" : "/v1/completions");
        }
    }
    return 0;
}

static int parse_fields(server_request *r, const cJSON *o, verr *err) {
    const cJSON *m = field(o, "model"), *so = field(o, "stream_options");
    if (m && !cJSON_IsString(m)) return bad_type(r, err, "model", m, "a string");
    if (m && dup_str(&r->model, m->valuestring, r, err)) return -1;
    // a missing prompt or messages first: a chat body with a "prompt" lacks its messages
    if (r->chat ? parse_messages(r, o, err) : parse_prompt(r, o, err)) return -1;
    if (check_field_names(r, o, err)) return -1;
    int64_t max_tokens = -1, top_k = GEN_DEFAULT_TOP_K, n = 1, seed = -1, last_n = -1;
    const char *max_name = r->chat && field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (get_bool(r, o, "echo", &r->echo, err)) return -1;
    const cJSON *mt = field(o, max_name);
    if (!r->echo && cJSON_IsNumber(mt) && mt->valuedouble == 0)
        return bad(r, err, SRV_E_VALUE, max_name, "'%s' must be at least 1 (0 only with \"echo\": true, to score the prompt)%s", NULL);
    if (get_int(r, o, max_name, r->echo ? 0 : 1, 0x7fffffff, &max_tokens, err) ||
        get_number(r, o, "temperature", 0, 100, &r->temperature, err) ||
        get_number(r, o, "top_p", 1e-9, 1, &r->top_p, err) || get_number(r, o, "min_p", 0, 0.999999, &r->min_p, err) ||
        get_int(r, o, "top_k", 0, 0x7fffffff, &top_k, err) || get_int(r, o, "n", 1, SERVER_MAX_N, &n, err) ||
        get_int(r, o, "seed", 0, 9007199254740992.0, &seed, err) || parse_stop(r, o, err) ||
        get_bool(r, o, "stream", &r->stream, err) || parse_sampler(r, o, err) || parse_logprobs(r, o, err) ||
        get_bool(r, o, "metrics", &r->metrics, err) || get_bool(r, o, "escape_special", &r->escape_special, err) ||
        parse_logit_bias(r, o, err) || get_number(r, o, "presence_penalty", -2, 2, &r->presence, err) ||
        get_number(r, o, "frequency_penalty", -2, 2, &r->frequency, err) ||
        get_number(r, o, "repeat_penalty", 1e-6, 1e6, &r->repeat_penalty, err) ||
        get_int(r, o, "repeat_last_n", -1, 0x7fffffff, &last_n, err))
        return -1;
    r->repeat_last_n = (int)last_n;
    if (so && !cJSON_IsObject(so)) return bad_type(r, err, "stream_options", so, "an object");
    if (so && get_bool(r, so, "include_usage", &r->include_usage, err)) return -1;
    if (!r->chat && (long)r->n_prompts * n > SERVER_MAX_CHOICES)
        return bad(r, err, SRV_E_VALUE, "n", "'%s' times the prompts exceeds 4096 choices per request%s", NULL);
    r->max_tokens = (int)max_tokens, r->top_k = (int)top_k, r->n = (int)n;
    r->has_seed = seed >= 0, r->seed = seed >= 0 ? (uint64_t)seed : 0;
    return 0;
}

int server_parse_request(const char *body, size_t len, int chat, server_request *out, verr *err) {
    memset(out, 0, sizeof *out);
    out->chat = chat, out->max_tokens = -1, out->n = 1;
    // the defaults of varent run and chat (host/decode/defaults.h)
    out->temperature = GEN_DEFAULT_TEMP, out->top_p = GEN_DEFAULT_TOP_P, out->min_p = GEN_DEFAULT_MIN_P;
    out->repeat_penalty = 1, out->repeat_last_n = -1;
    out->sampler = -1, out->metrics = -1, out->escape_special = -1;
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
    } else if (json_in_find_nul(buf, nul_path, sizeof nul_path)) {
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
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) free(r->prompts[i].text), free(r->prompts[i].ids);
    free(r->prompts);
    for (int i = 0; i < r->n_msgs; i++) free(r->msgs[i].role), free(r->msgs[i].content);
    free(r->msgs), free(r->bias);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    memset(r, 0, sizeof *r);
}

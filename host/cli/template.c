// template.c: `varent template` renders a conversation with a model's chat
// template and prints the exact prompt text (no trailing newline), to check what the
// model will see.
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host/cli/args.h"
#include "host/cli/ranks.h"
#include "host/cli/commands.h"
#include "host/formats/model_path.h"
#include "host/util/fileio.h"
#include "host/util/err.h"
#include "tokenizer/chat.h"

static const char *const template_moved[] = { "-t", "-t is --threads everywhere; give the template with -m PATH", NULL,
                                              NULL };
static const cli_opt template_opts[] = {
    { "-m|--model|--template", "PATH", "model", NULL, "model dir, tokenizer_config.json, or a .jinja template file", 0 },
    { "--messages", "FILE", "prompt", NULL, "JSON array of {\"role\", \"content\"[, \"reasoning_content\"]}; - is stdin", 0 },
    { "--chat-template", "NAME", "chat", "detected",
      "llama3, llama3.1, llama3.2, chatml, qwen2.5, smollm2, qwen3 or llama2 (then -m is optional)", 0 },
    { "--no-generation-prompt", NULL, "chat", NULL, "omit the assistant turn opener", 0 },
    { "--no-think", NULL, "chat", NULL, "Qwen3: render the empty <think> block (enable_thinking=false)", 0 },
    { "--date", "STRING", "chat", "the template's (Llama 3.2: today)", "Llama 3.1+: the 'Today Date' value (e.g. \"26 Jul 2024\")", 0 },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const template_tables[] = { template_opts, NULL };
const cli_spec cli_template_spec = {
    "template", "-m PATH --messages FILE.json [options]",
    "Render a conversation with a model's chat template and print the exact prompt (no trailing newline).",
    "Docs: docs/chat.md.", template_tables, template_moved, NULL,
};

// Parse JSON, reporting the line and byte offset of a syntax error.
static cJSON *parse_json(const char *text, const char *path, verr *err) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 0);
    if (j) return j;
    size_t off = end ? (size_t)(end - text) : 0;
    int line = 1;
    for (size_t i = 0; i < off; i++) line += text[i] == '\n';
    verr_set(err, "%s: invalid JSON at line %d (byte offset %zu)", path, line, off);
    return NULL;
}

// A special-token field: a string, or {"content": "..."} in older configs.
static const char *token_field(const cJSON *cfg, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, name);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

// chat_template is a string, or a list of {name, template}: take "default".
static const char *config_template(const cJSON *cfg) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsString(t)) return t->valuestring;
    const cJSON *it, *first = NULL;
    cJSON_ArrayForEach(it, t) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *body = cJSON_GetObjectItemCaseSensitive(it, "template");
        if (!cJSON_IsString(body)) continue;
        if (!first) first = body;
        if (cJSON_IsString(name) && !strcmp(name->valuestring, "default")) return body->valuestring;
    }
    return first ? first->valuestring : NULL;
}

typedef struct {
    char *text;    // template text (malloc'd) or NULL
    cJSON *cfg;    // tokenizer_config.json, or NULL
    char src[1100];  // where the template came from, for messages
} template_src;

static int load_config(template_src *ts, const char *path, verr *err) {
    char *text = cli_read_all(path, err);
    if (!text) return -1;
    ts->cfg = parse_json(text, path, err);
    free(text);
    if (!ts->cfg) return -1;
    const char *t = config_template(ts->cfg);
    if (t && !(ts->text = strdup(t))) return verr_set(err, "out of memory");
    snprintf(ts->src, sizeof ts->src, "%s (field chat_template)", path);
    return 0;
}

// PATH: a model dir (tokenizer_config.json, else chat_template.jinja), a .json
// config, or a template file.
static int load_template(template_src *ts, const char *path, verr *err) {
    struct stat st;
    if (stat(path, &st) != 0) return verr_set(err, "%s: %s", path, strerror(errno));
    char p[1024];
    if (S_ISDIR(st.st_mode)) {
        snprintf(p, sizeof p, "%s/tokenizer_config.json", path);
        if (stat(p, &st) == 0 && load_config(ts, p, err)) return -1;
        if (ts->text) return 0;
        snprintf(p, sizeof p, "%s/chat_template.jinja", path);
        if (stat(p, &st) != 0) {
            snprintf(ts->src, sizeof ts->src, "%s", path);
            return 0;  // no template: only --chat-template can render
        }
        path = p;
    } else {
        size_t n = strlen(path);
        if (n >= 5 && !strcmp(path + n - 5, ".json")) return load_config(ts, path, err);
    }
    ts->text = cli_read_all(path, err);
    snprintf(ts->src, sizeof ts->src, "%s", path);
    return ts->text ? 0 : -1;
}

// messages JSON -> chat_msg array pointing into the cJSON tree.
static int parse_messages(const cJSON *arr, const char *path, chat_msg **out, int *n, verr *err) {
    if (!cJSON_IsArray(arr)) return verr_set(err, "%s: expected a JSON array of messages", path);
    int count = cJSON_GetArraySize(arr);
    chat_msg *m = calloc(count ? (size_t)count : 1, sizeof *m);
    if (!m) return verr_set(err, "out of memory");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(it, "reasoning_content");
        const char *bad = !cJSON_IsObject(it)         ? "is not an object"
                          : !cJSON_IsString(role)     ? "needs a string \"role\""
                          : !cJSON_IsString(content)  ? "needs a string \"content\""
                          : reasoning && !cJSON_IsString(reasoning) && !cJSON_IsNull(reasoning)
                              ? "has a \"reasoning_content\" that is not a string or null"
                              : NULL;
        if (bad) {
            free(m);
            return verr_set(err, "%s: message %d %s", path, i, bad);
        }
        m[i].role = role->valuestring;
        m[i].content = content->valuestring;
        m[i].reasoning = cJSON_IsString(reasoning) ? reasoning->valuestring : NULL;
        i++;
    }
    *out = m;
    *n = count;
    return 0;
}

static int pick_format(const template_src *ts, const char *name, chat_format *f, verr *err) {
    if (name) return chat_format_from_name(name, f, err);
    if (!ts->text)
        return verr_set(err, "%s: no chat_template found; pass --chat-template NAME", ts->src);
    *f = chat_detect(ts->text);
    if (f->kind == CHAT_UNKNOWN)
        return verr_set(err, "%s: chat template not recognised (Llama 2/3, ChatML, Qwen3 are "
                             "known); pass --chat-template NAME", ts->src);
    return 0;
}

static int render_and_print(const char *tpath, const char *mpath, const char *name, chat_opts o,
                            verr *err) {
    template_src ts = {0};
    cJSON *mj = NULL;
    chat_msg *msgs = NULL;
    char *out = NULL, *mtext = NULL;
    int n = 0, rc = -1;
    chat_format f;
    char dir[4096];
    int tmp = 0;
    if (tpath && model_path_tokenizer(tpath, dir, sizeof dir, &tmp, err)) goto done;
    int bad = tpath && load_template(&ts, dir, err);
    model_path_tokenizer_done(dir, tmp);
    if (tmp && tpath) snprintf(ts.src, sizeof ts.src, "%s (metadata tokenizer.chat_template)", tpath);
    if (bad) goto done;
    if (!tpath) snprintf(ts.src, sizeof ts.src, "(no -t)");
    if (pick_format(&ts, name, &f, err)) goto done;
    if (ts.cfg) {
        o.bos_token = token_field(ts.cfg, "bos_token");
        o.eos_token = token_field(ts.cfg, "eos_token");
    }
    if (!(mtext = cli_read_all(mpath, err)) || !(mj = parse_json(mtext, mpath, err))) goto done;
    if (parse_messages(mj, mpath, &msgs, &n, err)) goto done;
    if (!(out = chat_render(&f, msgs, n, &o, err))) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        verr_set(err, "%s: %s", mpath, why);
        goto done;
    }
    size_t len = strlen(out);
    if (fwrite(out, 1, len, stdout) != len || fflush(stdout) != 0) {
        verr_set(err, "writing to stdout: %s", strerror(errno));
        goto done;
    }
    rc = 0;
done:
    free(out);
    free(msgs);
    free(mtext);
    cJSON_Delete(mj);
    cJSON_Delete(ts.cfg);
    free(ts.text);
    return rc;
}

int cmd_template(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_template_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    const char *tpath = args_str(&a, "-m", NULL);
    const char *mpath = args_str(&a, "--messages", NULL);
    const char *name = args_str(&a, "--chat-template", NULL);
    chat_opts o = chat_opts_default();
    o.add_generation_prompt = !args_flag(&a, "--no-generation-prompt");
    o.enable_thinking = !args_flag(&a, "--no-think");
    o.date_string = args_str(&a, "--date", NULL);
    if (args_finish(&a, 0)) return cli_usage_error("template", "%s", a.err);
    if (!mpath) return cli_usage_error("template", "--messages FILE is required");
    if (!tpath && !name) return cli_usage_error("template", "-m PATH or --chat-template NAME is required");
    verr err = { { 0 } };
    if (render_and_print(tpath, mpath, name, o, &err)) return cli_error("template", "%s", err.msg);
    return 0;
}

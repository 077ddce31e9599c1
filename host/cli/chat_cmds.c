// chat_cmds.c: see chat_cmds.h. /save writes the conversation as the JSON array that
// `varent template --messages` and /load read: [{"role": ..., "content": ...}, ...].
#include "host/cli/chat_cmds.h"
#include "host/cli/ranks.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "host/util/fileio.h"
#include "host/util/outfile.h"

void chat_print_help(FILE *f) {
    fputs("commands (never sent to the model):\n"
          "  /help            this list\n"
          "  /reset           clear the conversation (the system prompt stays)\n"
          "  /system TEXT     set the system prompt (/system alone shows it, /system - removes it)\n"
          "  /save FILE       write the conversation as JSON ([{\"role\",\"content\"}, ...])\n"
          "  /load FILE       replace the conversation with one saved by /save\n"
          "  /quit            leave (also Ctrl-D at an empty prompt)\n"
          "keys: Enter sends; a line ending in \\ continues the message; a pasted block is one message;\n"
          "      Up/Down recall earlier messages; Ctrl-C stops a reply (twice at an empty prompt: quit).\n"
          "A message that starts with / is sent by doubling it: //etc.\n",
          f);
}

void chat_remove_message(chat_conv *conv, int i) {
    free((char *)conv->msgs[i].role), free((char *)conv->msgs[i].content);
    memmove(conv->msgs + i, conv->msgs + i + 1, sizeof *conv->msgs * (size_t)(conv->n - i - 1));
    conv->n--;
}

int chat_set_system(chat_state *c, const char *text, verr *err) {
    chat_conv *conv = &c->conv;
    int has = conv->n > 0 && !strcmp(conv->msgs[0].role, "system");
    char *copy = text ? strdup(text) : NULL;
    if (text && !copy) return verr_set(err, "out of memory");
    free(c->system);
    c->system = copy;
    if (has) chat_remove_message(conv, 0);
    if (!text) return 0;
    if (chat_conv_add(conv, "system", text, err)) return -1;  // appended, then moved first
    chat_msg m = conv->msgs[conv->n - 1];
    memmove(conv->msgs + 1, conv->msgs, sizeof *conv->msgs * (size_t)(conv->n - 1));
    conv->msgs[0] = m;
    return 0;
}

static int yes(chat_state *c, const char *question) {
    const char *ans;
    if (repl_ask(c->in, question, &ans) != REPL_LINE) return 0;
    return ans[0] == 'y' || ans[0] == 'Y';
}

static int turns(const chat_conv *conv) {
    int n = 0;
    for (int i = 0; i < conv->n; i++) n += !strcmp(conv->msgs[i].role, "user");
    return n;
}

static void cmd_reset(chat_state *c) {
    if (c->tty && c->conv.n > 0 && turns(&c->conv) > 0) {
        char q[128];
        int n = turns(&c->conv);
        snprintf(q, sizeof q, "clear the conversation (%d turn%s)? [y/N] ", n, n == 1 ? "" : "s");
        if (!yes(c, q)) {
            fprintf(stderr, "kept the conversation\n");
            return;
        }
    }
    chat_conv_reset(&c->conv);
    verr err = { { 0 } };
    if (c->system && chat_conv_add(&c->conv, "system", c->system, &err)) fprintf(stderr, "varent chat: %s\n", err.msg);
    fprintf(stderr, "conversation cleared%s\n", c->system ? " (system prompt kept)" : "");
}

static void cmd_system(chat_state *c, const char *arg) {
    if (!arg[0]) {
        fprintf(stderr, c->system ? "system prompt: %s\n" : "no system prompt%s\n", c->system ? c->system : "");
        return;
    }
    verr err = { { 0 } };
    int off = !strcmp(arg, "-");
    if (chat_set_system(c, off ? NULL : arg, &err)) fprintf(stderr, "varent chat: %s\n", err.msg);
    else fprintf(stderr, off ? "system prompt removed\n" : "system prompt set\n");
}

// JSON text must be UTF-8: a reply cut inside a character (or a model's stray bytes)
// is saved with U+FFFD in place of each invalid byte. malloc'd.
static char *valid_utf8(const char *s) {
    size_t n = strlen(s), w = 0;
    char *out = malloc(3 * n + 1);
    for (size_t i = 0; out && i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k > 0) memcpy(out + w, s + i, (size_t)k), w += (size_t)k, i += (size_t)k;
        else memcpy(out + w, "\xEF\xBF\xBD", 3), w += 3, i++;
    }
    if (out) out[w] = 0;
    return out;
}

static char *conv_json(const chat_conv *conv) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < conv->n; i++) {
        cJSON *m = cJSON_CreateObject();
        char *text = valid_utf8(conv->msgs[i].content);
        if (!m || !text || !cJSON_AddStringToObject(m, "role", conv->msgs[i].role) ||
            !cJSON_AddStringToObject(m, "content", text)) {
            free(text), cJSON_Delete(m), cJSON_Delete(arr);
            return NULL;
        }
        free(text);
        cJSON_AddItemToArray(arr, m);
    }
    char *s = arr ? cJSON_Print(arr) : NULL;
    cJSON_Delete(arr);
    return s;
}

static void cmd_save(chat_state *c, const char *path) {
    if (!path[0]) return (void)fprintf(stderr, "usage: /save FILE\n");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
        if (!c->tty) return (void)fprintf(stderr, "varent chat: /save %s: the file exists; not replaced\n", path);
        char q[4200];
        snprintf(q, sizeof q, "%s exists; replace it? [y/N] ", path);
        if (!yes(c, q)) return (void)fprintf(stderr, "not saved\n");
    }
    verr err = { { 0 } };
    char *json = conv_json(&c->conv);
    outfile o = { 0 };
    int rc = json ? outfile_open(&o, path, NULL, &err) : verr_set(&err, "out of memory");
    if (rc == 0 && (fputs(json, o.f) < 0 || fputc('\n', o.f) == EOF)) rc = verr_set(&err, "%s: write failed: %s", path, strerror(errno));
    if (rc == 0) rc = outfile_commit(&o, &err);
    outfile_abort(&o);
    cJSON_free(json);
    if (rc) fprintf(stderr, "varent chat: /save: %s\n", err.msg);
    else fprintf(stderr, "saved %d message%s to %s\n", c->conv.n, c->conv.n == 1 ? "" : "s", path);
}

// The messages of a /save file, checked whole before anything changes.
static int load_messages(const char *path, cJSON **out, verr *err) {
    char *text = cli_read_all(path, err);
    if (!text) return -1;
    cJSON *arr = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsArray(arr)) return cJSON_Delete(arr), verr_set(err, "%s: not a JSON array of messages", path);
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, arr) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
            cJSON_Delete(arr);
            return verr_set(err, "%s: message %d: needs string \"role\" and \"content\"", path, i);
        }
        const char *r = role->valuestring;
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
            verr_set(err, "%s: message %d: unknown role '%.64s' (system, user, assistant, tool)", path, i, r);
            cJSON_Delete(arr);  // after the message: r points into it
            return -1;
        }
        i++;
    }
    *out = arr;
    return 0;
}

static void cmd_load(chat_state *c, const char *path) {
    if (!path[0]) return (void)fprintf(stderr, "usage: /load FILE\n");
    verr err = { { 0 } };
    cJSON *arr = NULL;
    if (load_messages(path, &arr, &err)) return (void)fprintf(stderr, "varent chat: /load: %s\n", err.msg);
    chat_conv_reset(&c->conv);
    free(c->system);
    c->system = NULL;
    const cJSON *m;
    int rc = 0;
    cJSON_ArrayForEach(m, arr) {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        const char *content = cJSON_GetObjectItemCaseSensitive(m, "content")->valuestring;
        if (c->conv.n == 0 && !strcmp(role, "system")) c->system = strdup(content);
        if (rc == 0) rc = chat_conv_add(&c->conv, role, content, &err);
    }
    cJSON_Delete(arr);
    if (rc) fprintf(stderr, "varent chat: /load: %s\n", err.msg);
    else fprintf(stderr, "loaded %d message%s from %s\n", c->conv.n, c->conv.n == 1 ? "" : "s", path);
}

chat_cmd_result chat_command(chat_state *c, const char *line) {
    char name[32];
    size_t k = strcspn(line + 1, " \t");
    snprintf(name, sizeof name, "%.*s", (int)(k < sizeof name - 1 ? k : sizeof name - 1), line + 1);
    const char *arg = line + 1 + k;
    while (*arg == ' ' || *arg == '\t') arg++;
    if (!strcmp(name, "quit") || !strcmp(name, "exit")) return CHAT_CMD_QUIT;
    if (!strcmp(name, "help")) chat_print_help(stderr);
    else if (!strcmp(name, "reset") || !strcmp(name, "clear")) cmd_reset(c);
    else if (!strcmp(name, "system")) cmd_system(c, arg);
    else if (!strcmp(name, "save")) cmd_save(c, arg);
    else if (!strcmp(name, "load")) cmd_load(c, arg);
    else fprintf(stderr, "unknown command /%s: /help lists the commands (//text sends a message starting with /)\n", name);
    return CHAT_CMD_DONE;
}

// eval_chart.c: see eval_chart.h.
#include "host/report/eval_chart.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host/util/fileio.h"
#include "host/util/stats.h"

#define MAX_GROUPS 256
#define MAX_ARMS 16

typedef struct {
    char arm[160], task[160];  // task "" : the arm over all tasks
    long n, k;
    double compute;
} group;

typedef struct {
    group g[MAX_GROUPS];
    int n;
    char arms[MAX_ARMS][160];
    int n_arms;
} chart;

static group *group_of(chart *c, const char *arm, const char *task) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->g[i].arm, arm) && !strcmp(c->g[i].task, task)) return &c->g[i];
    if (c->n == MAX_GROUPS) return NULL;
    group *g = &c->g[c->n++];
    memset(g, 0, sizeof *g);
    snprintf(g->arm, sizeof g->arm, "%s", arm), snprintf(g->task, sizeof g->task, "%s", task);
    return g;
}

static int arm_no(chart *c, const char *arm) {
    for (int a = 0; a < c->n_arms; a++)
        if (!strcmp(c->arms[a], arm)) return a;
    if (c->n_arms == MAX_ARMS) return -1;
    snprintf(c->arms[c->n_arms], sizeof c->arms[0], "%s", arm);
    return c->n_arms++;
}

static const cJSON *first_record(char *text, cJSON **owner) {
    for (char *p = text, *next; p && *p; p = next) {
        next = strchr(p, '\n');
        if (next) *next++ = 0;
        if (strspn(p, " \t\r") == strlen(p)) continue;
        *owner = cJSON_Parse(p);
        return *owner;
    }
    return NULL;
}

int eval_chart_detect(const char *path) {
    verr err;
    char *text = fileio_read_all(path, &err);
    if (!text) return 0;
    cJSON *o = NULL;
    const cJSON *r = first_record(text, &o);
    int yes = cJSON_IsObject(r) && cJSON_GetObjectItemCaseSensitive(r, "arm") && cJSON_GetObjectItemCaseSensitive(r, "correct");
    cJSON_Delete(o);
    free(text);
    return yes;
}

static int add_record(chart *c, const cJSON *o) {
    const cJSON *arm = cJSON_GetObjectItemCaseSensitive(o, "arm"), *task = cJSON_GetObjectItemCaseSensitive(o, "task");
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(o, "correct"), *cp = cJSON_GetObjectItemCaseSensitive(o, "compute");
    if (!cJSON_IsString(arm) || !cJSON_IsString(task) || !cJSON_IsBool(ok) || !cJSON_IsNumber(cp)) return -1;
    if (arm_no(c, arm->valuestring) < 0) return -2;
    group *gs[2] = { group_of(c, arm->valuestring, ""), group_of(c, arm->valuestring, task->valuestring) };
    for (int i = 0; i < 2; i++) {
        if (!gs[i]) return -2;
        gs[i]->n++, gs[i]->k += cJSON_IsTrue(ok), gs[i]->compute += cp->valuedouble;
    }
    return 0;
}

static int read_chart(chart *c, const char *path, verr *err) {
    char *text = fileio_read_all(path, err);
    if (!text) return -1;
    int rc = 0, line = 0;
    for (char *p = text, *next; rc == 0 && p && *p; p = next) {
        next = strchr(p, '\n');
        if (next) *next++ = 0;
        line++;
        if (strspn(p, " \t\r") == strlen(p)) continue;
        cJSON *o = cJSON_Parse(p);
        int k = cJSON_IsObject(o) ? add_record(c, o) : -1;
        cJSON_Delete(o);
        if (k == -1)
            rc = verr_set(err, "%s:%d: not an eval trial record (needs \"arm\", \"task\", \"correct\", \"compute\")", path, line);
        if (k == -2) rc = verr_set(err, "%s:%d: more than %d arms or %d (task, arm) pairs", path, line, MAX_ARMS, MAX_GROUPS);
    }
    free(text);
    if (rc == 0 && c->n == 0) rc = verr_set(err, "%s: no trial records", path);
    return rc;
}

static const char *color(int a) {
    static const char *const c[] = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f" };
    return c[a % 8];
}

#define W 900
#define H 600
#define X0 80.0
#define X1 640.0
#define Y0 60.0
#define Y1 540.0

static void axes(svg *s, double xmax) {
    double t[32];
    int n = svg_ticks(0, 1, 10, t);
    svg_printf(s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", X0, Y0,
               X1 - X0, Y1 - Y0);
    for (int i = 0; i < n; i++) {
        double y = Y1 - t[i] * (Y1 - Y0);
        svg_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", X0, y, X1, y);
        svg_text(s, X0 - 6, y + 4, "text-anchor=\"end\" font-size=\"10\"", "%g", t[i]);
    }
    n = svg_ticks(0, xmax, 8, t);
    for (int i = 0; i < n; i++) {
        double x = X0 + t[i] / xmax * (X1 - X0);
        svg_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, Y1, x, Y1 + 4);
        svg_text(s, x, Y1 + 16, "text-anchor=\"middle\" font-size=\"10\"", "%g", t[i]);
    }
    svg_text(s, (X0 + X1) / 2, Y1 + 36, "text-anchor=\"middle\"", "decode compute per item (forward positions)");
    svg_printf(s, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">accuracy</text>\n", X0 - 45,
               (Y0 + Y1) / 2);
}

static void draw(svg *s, const chart *c, const char *title, const char *path) {
    double xmax = 1;
    for (int i = 0; i < c->n; i++) xmax = fmax(xmax, c->g[i].compute / c->g[i].n);
    xmax *= 1.1;
    svg_begin(s, W, H);
    svg_text(s, X0, 30, "font-size=\"15\" font-weight=\"bold\"", "%s", title ? title : "accuracy vs compute per arm");
    svg_text(s, X0, 48, "fill=\"#555\" font-size=\"11\"", "%s", path);
    axes(s, xmax);
    svg_printf(s, "<g id=\"task-marks\">\n");
    for (int i = 0; i < c->n; i++) {
        const group *g = &c->g[i];
        if (!g->task[0]) continue;
        int a = 0;
        while (strcmp(c->arms[a], g->arm)) a++;
        double x = X0 + g->compute / g->n / xmax * (X1 - X0), y = Y1 - (double)g->k / g->n * (Y1 - Y0);
        svg_printf(s, "<rect class=\"task\" x=\"%.1f\" y=\"%.1f\" width=\"5\" height=\"5\" fill=\"%s\" fill-opacity=\"0.5\">"
                      "<title>", x - 2.5, y - 2.5, color(a));
        svg_escape(s, g->arm), svg_printf(s, " on "), svg_escape(s, g->task);
        svg_printf(s, ": %ld/%ld</title></rect>\n", g->k, g->n);
    }
    svg_printf(s, "</g>\n<g id=\"arm-marks\">\n");
    for (int a = 0; a < c->n_arms; a++)
        for (int i = 0; i < c->n; i++) {
            const group *g = &c->g[i];
            if (g->task[0] || strcmp(g->arm, c->arms[a])) continue;
            double lo, hi, acc = (double)g->k / g->n;
            stats_wilson(g->k, g->n, STATS_Z95, &lo, &hi);
            double x = X0 + g->compute / g->n / xmax * (X1 - X0);
            svg_printf(s, "<g class=\"arm\" data-arm=\"%d\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"2\"/>", a, x, Y1 - lo * (Y1 - Y0), x, Y1 - hi * (Y1 - Y0), color(a));
            svg_printf(s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"%s\"><title>", x, Y1 - acc * (Y1 - Y0), color(a));
            svg_escape(s, g->arm);
            svg_printf(s, ": accuracy %.3f [%.3f, %.3f], %ld trials, %.1f forward positions per item</title></circle></g>\n",
                       acc, lo, hi, g->n, g->compute / g->n);
            double ly = Y0 + 10 + 22 * a;
            svg_printf(s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"6\" fill=\"%s\"/>", X1 + 25, ly, color(a));
            svg_text(s, X1 + 37, ly + 4, "font-size=\"11\"", "%.40s: %.3f", g->arm, acc);
        }
    svg_printf(s, "</g>\n");
    svg_text(s, X1 + 20, Y0 + 30 + 22 * c->n_arms, "font-size=\"10\" fill=\"#555\"", "bars: 95%% Wilson interval");
    svg_text(s, X1 + 20, Y0 + 46 + 22 * c->n_arms, "font-size=\"10\" fill=\"#555\"", "squares: one task");
    svg_end(s);
}

int eval_chart_draw(svg *s, const char *path, const char *title, verr *err) {
    chart *c = calloc(1, sizeof *c);
    if (!c) return verr_set(err, "out of memory");
    int rc = read_chart(c, path, err);
    if (rc == 0) draw(s, c, title, path);
    free(c);
    return rc;
}

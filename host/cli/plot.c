// plot.c: `varent plot FILE.jsonl -o OUT.svg|OUT.png [--profile NAME] [--set K=V]
// [--title TEXT]`: entropy and varentropy per token (points coloured by quadrant,
// rollbacks and critic checks as markers) and an entropy x varentropy scatter with the
// profile's quadrant boxes. SVG is written directly; PNG goes through rsvg-convert.
//
// Marks (for tests and scripts): every token is one <circle class="tok ..."> in each
// of the groups #entropy-marks, #varentropy-marks and #scatter-marks (the latter two
// only for tokens with a varentropy); every rollback is one <g class="rollback"> (the
// entropy panel's; the varentropy panel repeats it as <g class="rollback-repeat">).
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host/cli/args.h"
#include "host/cli/commands.h"
#include "host/decode/entropix.h"
#include "host/util/interrupt.h"
#include "host/util/outfile.h"
#include "host/report/eval_chart.h"
#include "host/report/plot_log.h"
#include "host/report/svg.h"

extern char **environ;

static int fail(const char *msg) { return cli_error("plot", "%s", msg); }

static const cli_opt plot_opts[] = {
    { "-o|--out", "FILE", "output", NULL, "the plot: .svg, or .png (through rsvg-convert) (required)", 0 },
    { "--title", "TEXT", "output", "FILE: entropy and varentropy per token", "the plot's title", 0 },
    { "--profile", "NAME|FILE", "entropix", "seed", "whose quadrant thresholds to draw (stock name or NAME.json)", 0 },
    { "--set", "KEY=VALUE", "entropix", NULL, "one threshold over the profile", ARG_REPEAT },
    { NULL, NULL, NULL, NULL, NULL, 0 },
};
static const cli_opt *const plot_tables[] = { plot_opts, NULL };
const cli_spec cli_plot_spec = {
    "plot", "FILE.jsonl -o OUT.svg|OUT.png [options]",
    "Plot entropy and varentropy per token, and the quadrant scatter, of a metrics or agents log.",
    "FILE is a --metrics-out log of varent run or an agents --log; for `varent eval -o` trial records it draws "
    "accuracy against compute per arm (--title applies; the entropix options do not). Docs: docs/research.md.",
    plot_tables, NULL, NULL,
};

#define W 1000
#define H 1010
#define H_ENTROPY_ONLY 540  // a log without varentropy: the entropy panel and the legend
#define LEFT 70.0
#define RIGHT (W - 30.0)

typedef struct {
    double x0, x1, y0, y1;        // pixel box (y0 top)
    double vx0, vx1, vy0, vy1;    // value ranges
} frame;

static double fx(const frame *f, double v) { return f->x0 + (v - f->vx0) / (f->vx1 - f->vx0) * (f->x1 - f->x0); }
static double fy(const frame *f, double v) { return f->y1 - (v - f->vy0) / (f->vy1 - f->vy0) * (f->y1 - f->y0); }

static const char *q_color(int q) {
    static const char *const c[Q_COUNT] = { "#2ca02c", "#1f77b4", "#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#7f7f7f" };
    return q >= 0 && q < Q_COUNT ? c[q] : "#7f7f7f";
}

static const char *q_name(int q) { return q >= 0 ? entropix_quadrant_name((entropix_quadrant)q) : "unknown"; }

// Axes, grid and labels of a frame.
static void axes(svg *s, const frame *f, const char *xlabel, const char *ylabel, int integer_x) {
    double t[32];
    int n = svg_ticks(f->vy0, f->vy1, 5, t);
    svg_printf(s, "<g class=\"axes\" stroke=\"#ccc\" stroke-width=\"0.5\">\n");
    for (int i = 0; i < n; i++) svg_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f->x0, fy(f, t[i]), f->x1, fy(f, t[i]));
    svg_printf(s, "</g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", f->x0,
               f->y0, f->x1 - f->x0, f->y1 - f->y0);
    for (int i = 0; i < n; i++) svg_text(s, f->x0 - 6, fy(f, t[i]) + 4, "text-anchor=\"end\" font-size=\"10\"", "%g", t[i]);
    n = svg_ticks(f->vx0, f->vx1, 10, t);
    for (int i = 0; i < n; i++) {
        if (integer_x && t[i] != floor(t[i])) continue;
        svg_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", fx(f, t[i]), f->y1,
                   fx(f, t[i]), f->y1 + 4);
        svg_text(s, fx(f, t[i]), f->y1 + 15, "text-anchor=\"middle\" font-size=\"10\"", "%g", t[i]);
    }
    svg_text(s, (f->x0 + f->x1) / 2, f->y1 + 30, "text-anchor=\"middle\"", "%s", xlabel);
    svg_printf(s, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">", f->x0 - 45,
               (f->y0 + f->y1) / 2);
    svg_escape(s, ylabel);
    svg_printf(s, "</text>\n");
}

// The mark of one token: a circle with a tooltip.
static void mark(svg *s, const plot_token *t, int i, double x, double y, double r) {
    svg_printf(s, "<circle class=\"tok q-%s%s\" data-i=\"%d\" cx=\"%.2f\" cy=\"%.2f\" r=\"%.2f\" fill=\"%s\"%s>", q_name(t->quadrant),
               t->discarded ? " discarded" : "", i, x, y, r, q_color(t->quadrant),
               t->discarded ? " fill-opacity=\"0.3\" stroke=\"#333\" stroke-width=\"0.5\"" : "");
    svg_printf(s, "<title>#%d pos %d token %d &quot;", i, t->pos, t->token);
    svg_escape(s, t->text);
    svg_printf(s, "&quot; H=%.3f V=%.3f %s%s</title></circle>\n", t->entropy, t->varentropy, q_name(t->quadrant),
               t->discarded ? " (rolled back)" : "");
}

static double value(const plot_token *t, int which) { return which ? t->varentropy : t->entropy; }

static double max_of(const plot_log *l, int which) {
    double m = 0;
    for (int i = 0; i < l->n; i++)
        if (isfinite(value(&l->tok[i], which)) && value(&l->tok[i], which) > m) m = value(&l->tok[i], which);
    return m;
}

// Finite box bounds of metric k over the profile's four boxes, into t; returns the count.
static int thresholds(const entropix_config *c, int k, double *t) {
    int n = 0;
    for (int b = 0; b < ENTROPIX_N_BOXES; b++) {
        double v[2] = { c->box[b].lo[k], c->box[b].hi[k] };
        for (int j = 0; j < 2; j++) {
            int dup = !isfinite(v[j]);
            for (int i = 0; i < n && !dup; i++) dup = t[i] == v[j];
            if (!dup) t[n++] = v[j];
        }
    }
    return n;
}

// Rollback and critic markers over a time-series frame.
static void events(svg *s, const plot_log *l, const frame *f, int labels) {
    for (int e = 0; e < l->n_ev; e++) {
        const plot_event *ev = &l->ev[e];
        double x = fx(f, ev->at - 0.5);
        if (ev->kind == EV_ROLLBACK) {
            // the entropy panel's marker is the one counted; the varentropy panel repeats the line
            svg_printf(s, "<g class=\"%s\"><title>rollback: %d tokens removed, pos %d -&gt; %d</title>",
                       labels ? "rollback" : "rollback-repeat", ev->removed, ev->from_pos, ev->to_pos);
            svg_printf(s, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#d00\" stroke-width=\"1.2\" "
                          "stroke-dasharray=\"4 3\"/>", x, f->y0, x, f->y1);
            svg_printf(s, "<path d=\"M%.1f %.1f l-5 -8 h10 z\" fill=\"#d00\"/>", x, f->y0);
            if (labels)
                svg_printf(s, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"#d00\">-%d</text>", x + 6, f->y0 - 2,
                           ev->removed);
            svg_printf(s, "</g>\n");
        } else if (labels) {
            svg_printf(s, "<g class=\"critic critic-%s\"><title>critic: %s, action %s</title>", ev->bad ? "bad" : "good",
                       ev->bad ? "BAD" : "GOOD", ev->action);
            svg_printf(s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"6\" height=\"6\" fill=\"%s\"/></g>\n", x - 3, f->y1 - 8,
                       ev->bad ? "#d00" : "#2a2");
        }
    }
}

// One per-token panel: metric `which` (0 entropy, 1 varentropy) over generation order.
static void series(svg *s, const plot_log *l, const entropix_config *c, int which, double y0, double y1) {
    const char *name = which ? "varentropy" : "entropy";
    double top = max_of(l, which);
    frame f = { LEFT, RIGHT, y0, y1, -0.5, l->n - 0.5, 0, top > 0 ? top * 1.08 : 1 };
    axes(s, &f, l->agents ? "step (generation order, rolled-back tokens kept)" : "token (generation order)",
         which ? "varentropy (bits\xc2\xb2)" : "entropy (bits)", 1);
    double t[2 * ENTROPIX_N_BOXES];
    int nt = thresholds(c, which ? M_VENT : M_ENT, t);
    for (int i = 0; i < nt; i++)
        if (t[i] > f.vy0 && t[i] < f.vy1) {
            svg_printf(s, "<line class=\"threshold\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\" "
                          "stroke-dasharray=\"2 3\"/>\n", f.x0, fy(&f, t[i]), f.x1, fy(&f, t[i]));
            svg_text(s, f.x1 - 2, fy(&f, t[i]) - 3, "text-anchor=\"end\" font-size=\"9\" fill=\"#666\"", "%g", t[i]);
        }
    double r = l->n > 2000 ? 1.2 : l->n > 500 ? 1.8 : 2.6;
    svg_printf(s, "<polyline class=\"trace\" fill=\"none\" stroke=\"#bbb\" stroke-width=\"0.7\" points=\"");
    for (int i = 0; i < l->n; i++)
        if (isfinite(value(&l->tok[i], which))) svg_printf(s, "%.1f,%.1f ", fx(&f, i), fy(&f, value(&l->tok[i], which)));
    svg_printf(s, "\"/>\n");
    events(s, l, &f, !which);
    svg_printf(s, "<g id=\"%s-marks\">\n", name);
    for (int i = 0; i < l->n; i++)
        if (isfinite(value(&l->tok[i], which))) mark(s, &l->tok[i], i, fx(&f, i), fy(&f, value(&l->tok[i], which)), r);
    svg_printf(s, "</g>\n");
}

// Quadrant boxes (entropy and varentropy bounds only) clipped to the frame.
static void boxes(svg *s, const entropix_config *c, const frame *f) {
    for (int k = 0; k < ENTROPIX_N_BOXES; k++) {
        int q = c->order[k];
        if (q < 0 || q >= ENTROPIX_N_BOXES) continue;
        const entropix_box *b = &c->box[q];
        double hx0 = fmax(b->lo[M_ENT], f->vx0), hx1 = fmin(b->hi[M_ENT], f->vx1);
        double vy0 = fmax(b->lo[M_VENT], f->vy0), vy1 = fmin(b->hi[M_VENT], f->vy1);
        if (!(hx1 > hx0 && vy1 > vy0)) continue;
        double x = fx(f, hx0), y = fy(f, vy1), w = fx(f, hx1) - x, h = fy(f, vy0) - y;
        svg_printf(s, "<rect class=\"box q-%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                      "fill-opacity=\"0.1\" stroke=\"%s\" stroke-dasharray=\"5 3\"/>\n",
                   q_name(q), x, y, w, h, q_color(q), q_color(q));
        // inside the box when it is tall enough, else just above it
        svg_text(s, x + 4, h >= 18 ? y + 13 : y - 3, "font-size=\"11\" font-weight=\"bold\" fill-opacity=\"0.8\"", "%s",
                 q_name(q));
    }
}

static void scatter(svg *s, const plot_log *l, const entropix_config *c, double y0, double y1) {
    double th[2 * ENTROPIX_N_BOXES], hx = max_of(l, 0), vy = max_of(l, 1);
    int n = thresholds(c, M_ENT, th);
    for (int i = 0; i < n; i++) hx = fmax(hx, th[i]);
    n = thresholds(c, M_VENT, th);
    for (int i = 0; i < n; i++) vy = fmax(vy, th[i]);
    frame f = { LEFT, LEFT + 450, y0, y1, 0, hx > 0 ? hx * 1.08 : 1, 0, vy > 0 ? vy * 1.08 : 1 };
    boxes(s, c, &f);
    axes(s, &f, "entropy (bits)", "varentropy (bits\xc2\xb2)", 0);
    svg_printf(s, "<g id=\"scatter-marks\">\n");
    for (int i = 0; i < l->n; i++) {
        const plot_token *t = &l->tok[i];
        if (isfinite(t->varentropy)) mark(s, t, i, fx(&f, t->entropy), fy(&f, t->varentropy), 3);
    }
    svg_printf(s, "</g>\n");
}

static void legend(svg *s, const plot_log *l, const entropix_config *c, double x, double y) {
    int count[Q_COUNT + 1] = { 0 }, n_rb = 0, n_disc = 0, n_crit = 0;
    for (int i = 0; i < l->n; i++) count[l->tok[i].quadrant >= 0 ? l->tok[i].quadrant : Q_COUNT]++, n_disc += l->tok[i].discarded;
    for (int e = 0; e < l->n_ev; e++) n_rb += l->ev[e].kind == EV_ROLLBACK, n_crit += l->ev[e].kind == EV_CRITIC;
    svg_text(s, x, y, "font-weight=\"bold\"", "quadrant (tokens)");
    for (int q = 0; q <= Q_COUNT; q++) {
        if (!count[q]) continue;
        y += 20;
        svg_printf(s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"%s\"/>\n", x + 5, y - 4, q_color(q < Q_COUNT ? q : -1));
        svg_text(s, x + 16, y, "", "%s: %d", q < Q_COUNT ? q_name(q) : "unknown (not in the log)", count[q]);
    }
    y += 30;
    svg_printf(s, "<path d=\"M%.1f %.1f l-5 -8 h10 z\" fill=\"#d00\"/>\n", x + 5, y);
    svg_text(s, x + 16, y, "", "rollback (%d); dashed line at the step", n_rb);
    if (n_crit) {
        y += 20;
        svg_printf(s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"6\" height=\"6\" fill=\"#2a2\"/>", x + 2, y - 7);
        svg_printf(s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"6\" height=\"6\" fill=\"#d00\"/>\n", x + 10, y - 7);
        svg_text(s, x + 22, y, "", "critic check GOOD / BAD (%d)", n_crit);
    }
    if (n_disc) {
        y += 20;
        svg_printf(s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"#7f7f7f\" fill-opacity=\"0.3\" stroke=\"#333\"/>\n", x + 5, y - 4);
        svg_text(s, x + 16, y, "", "rolled back (%d)", n_disc);
    }
    y += 30;
    svg_text(s, x, y, "", "boxes and dashed lines: profile %s thresholds", c->name);
    svg_text(s, x, y + 16, "font-size=\"10\" fill=\"#555\"", "(entropy and varentropy bounds only)");
    if (l->agents)
        svg_text(s, x, y + 32, "font-size=\"10\" fill=\"#555\"", "agents log: entropy of the chosen proposal's distribution");
    if (l->n_varentropy == 0)
        svg_text(s, x, y + 48, "font-size=\"10\" fill=\"#555\"", "no varentropy in this log: the entropy panel alone");
}

static void draw(svg *s, const plot_log *l, const entropix_config *c, const char *title) {
    int n_rb = 0;
    for (int e = 0; e < l->n_ev; e++) n_rb += l->ev[e].kind == EV_ROLLBACK;
    svg_begin(s, W, l->n_varentropy > 0 ? H : H_ENTROPY_ONLY);
    svg_text(s, LEFT, 24, "font-size=\"15\" font-weight=\"bold\"", "%s", title);
    svg_text(s, RIGHT, 24, "text-anchor=\"end\" fill=\"#555\"", "%d %s, %d rollbacks, profile %s", l->n,
             l->agents ? "steps" : "tokens", n_rb, c->name);
    series(s, l, c, 0, 60, 260);
    if (l->n_varentropy > 0) {
        series(s, l, c, 1, 320, 520);
        scatter(s, l, c, 580, 960);
        legend(s, l, c, LEFT + 520, 600);
    } else {  // an agents log: no panel would be left empty
        legend(s, l, c, LEFT, 320);
    }
    svg_end(s);
}

static int has_ext(const char *path, const char *ext) {
    size_t n = strlen(path), k = strlen(ext);
    return n > k && !strcasecmp(path + n - k, ext);
}

// Is prog an executable file in a PATH directory?
static int in_path(const char *prog) {
    const char *path = getenv("PATH");
    char dir[4096], full[8192];
    for (const char *p = path ? path : ""; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(dir, sizeof dir, "%.*s", (int)(n < sizeof dir ? n : sizeof dir - 1), p);
        snprintf(full, sizeof full, "%s/%s", n ? dir : ".", prog);
        if (access(full, X_OK) == 0) return 1;
        p += n + (p[n] == ':');
    }
    return 0;
}

static int write_svg(const svg *s, const char *path, verr *err) {
    if (s->oom) return verr_set(err, "out of memory building the SVG");
    return outfile_write_all(path, s->buf, s->len, err);
}

// The SVG to a temporary file under $TMPDIR; rsvg-convert writes the PNG straight into
// the output file (host/util/outfile.h: a temporary file renamed on success, or a
// device node or FIFO in place).
static int write_png(const svg *s, const char *out, verr *err) {
    if (s->oom) return verr_set(err, "out of memory building the SVG");
    const char *dir = getenv("TMPDIR");
    char tsvg[4200];
    snprintf(tsvg, sizeof tsvg, "%s/varent-plot-XXXXXX.svg", dir && *dir ? dir : "/tmp");
    int fd = mkstemps(tsvg, 4);
    if (fd < 0) return verr_set(err, "%s: cannot create a temporary file: %s", tsvg, strerror(errno));
    int slot = interrupt_track(tsvg);
    int ok = write(fd, s->buf, s->len) == (ssize_t)s->len;
    ok = close(fd) == 0 && ok;
    outfile o;
    int rc = ok ? outfile_open(&o, out, NULL, err) : verr_set(err, "%s: write failed", tsvg);
    if (rc == 0) {
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, fileno(o.f), 1);
        char *argv[] = { "rsvg-convert", "-f", "png", tsvg, NULL };
        pid_t pid;
        int st = 0, e = posix_spawnp(&pid, "rsvg-convert", &fa, NULL, argv, environ);
        if (e == 0 && waitpid(pid, &st, 0) < 0) e = errno;
        posix_spawn_file_actions_destroy(&fa);
        if (e || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            outfile_abort(&o);
            rc = verr_set(err, "%s: rsvg-convert failed (%s)", out, e ? strerror(e) : "see its message above");
        } else {
            rc = outfile_commit(&o, err);
        }
    }
    unlink(tsvg);
    interrupt_untrack(slot);
    return rc;
}

// --profile NAME and --set KEY=VALUE (any number).
static int read_profile(args *a, entropix_config *c, verr *err) {
    const char *profile = args_str(a, "--profile", "seed"), *sets[64];
    int n = 0;
    for (const char *kv; (kv = args_each(a, "--set"));)
        if (n < 64) sets[n++] = kv;
    if (n == 64) return verr_set(err, "--set: at most 63 settings");
    if (entropix_profile_load(profile, c, err)) return -1;
    for (int i = 0; i < n; i++) {
        const char *kv = sets[i];
        const char *eq = strchr(kv, '=');
        char key[128];
        if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof key) return verr_set(err, "--set: '%s' is not KEY=VALUE", kv);
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        if (entropix_set(c, key, eq + 1, err)) return -1;
    }
    return 0;
}

int cmd_plot(int argc, char **argv) {
    args a;
    int rc0 = args_init(&a, &cli_plot_spec, argc, argv);
    if (rc0 >= 0) return rc0;
    const char *out = args_str(&a, "-o", NULL), *title = args_str(&a, "--title", NULL);
    entropix_config c;
    verr err = { { 0 } };
    int prc = read_profile(&a, &c, &err);
    if (args_finish(&a, 1)) return cli_usage_error("plot", "%s", a.err);
    const char *in = args_pos(&a, 0);
    if (!in) return cli_usage_error("plot", "missing FILE.jsonl (a metrics or agents log, or eval records)");
    if (!out) return cli_usage_error("plot", "missing -o OUT.svg|OUT.png");
    if (prc) return cli_usage_error("plot", "%s", err.msg);
    int png = has_ext(out, ".png");
    if (!png && !has_ext(out, ".svg")) return cli_usage_error("plot", "-o: the output name must end in .svg or .png");
    if (png && !in_path("rsvg-convert"))
        return fail("PNG output needs rsvg-convert (Debian/Ubuntu: apt-get install librsvg2-bin), which is not on "
                    "PATH; write an .svg instead");
    svg s = { 0 };
    if (eval_chart_detect(in)) {  // `varent eval -o` records: accuracy vs compute per arm
        int erc = eval_chart_draw(&s, in, title, &err);
        if (erc == 0) erc = png ? write_png(&s, out, &err) : write_svg(&s, out, &err);
        svg_free(&s);
        return erc ? fail(err.msg) : 0;
    }
    plot_log l;
    if (plot_log_read(&l, in, &err)) return fail(err.msg);
    char def_title[512];
    const char *base = strrchr(in, '/');
    snprintf(def_title, sizeof def_title, "%s: %s per token", base ? base + 1 : in,
             l.n_varentropy > 0 ? "entropy and varentropy" : "entropy");
    draw(&s, &l, &c, title ? title : def_title);
    int rc = png ? write_png(&s, out, &err) : write_svg(&s, out, &err);
    svg_free(&s);
    plot_log_free(&l);
    return rc ? fail(err.msg) : 0;
}

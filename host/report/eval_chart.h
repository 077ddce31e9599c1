// eval_chart.h: the accuracy-vs-compute chart of `varent eval -o` trial records: per
// arm, its accuracy over all trials (with the 95% Wilson interval as a bar) against
// the mean decode compute per trial (forward positions: kept and discarded tokens,
// branch rows, critic positions), plus one small mark per (task, arm).
#ifndef VARENT_EVAL_CHART_H
#define VARENT_EVAL_CHART_H

#include "host/report/svg.h"
#include "host/util/err.h"

// 1 when the file's first record is an eval trial record (has "arm" and "correct").
int eval_chart_detect(const char *path);
// Reads the records and draws the chart into s (begun and ended here). -1 with err
// naming the file and line of a bad record.
int eval_chart_draw(svg *s, const char *path, const char *title, verr *err);

#endif

// stats.h: the statistics an evaluation reports: the Wilson score interval of a
// proportion, McNemar's exact test and Newcombe's interval for the difference of two
// paired proportions, and sample quantiles. Pure functions, double precision.
#ifndef VARENT_STATS_H
#define VARENT_STATS_H

#define STATS_Z95 1.959963984540054  // the standard normal's 97.5th percentile

// Wilson score interval of k successes in n trials at z (n == 0: [0, 1]).
void stats_wilson(long k, long n, double z, double *lo, double *hi);
// McNemar's exact two-sided p-value for the discordant pair counts b (first right,
// second wrong) and c (the reverse): min(1, 2 P(X <= min(b, c))), X ~ Binomial(b + c,
// 1/2); 1 when b + c == 0.
double stats_mcnemar_exact(long b, long c);
// Newcombe's (1998) method 10 interval for p1 - p2 of paired binary outcomes: a both
// right, b first only, c second only, d both wrong. Wilson intervals of p1 and p2
// combined with the phi correlation of the 2x2 table (0 when a margin is empty).
void stats_paired_diff(long a, long b, long c, long d, double z, double *lo, double *hi);
// Sample quantile q in [0, 1] of sorted[n] (n >= 1), linearly interpolated between
// order statistics at q (n - 1) (numpy's default, "linear").
double stats_quantile(const double *sorted, long n, double q);
// The fraction of sorted[n] strictly below x (the empirical CDF just left of x).
double stats_rank(const double *sorted, long n, double x);
// Sorts x[n] ascending (NaN last).
void stats_sort(double *x, long n);

#endif

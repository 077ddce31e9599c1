// stats.c: see stats.h.
#include "host/util/stats.h"

#include <math.h>
#include <stdlib.h>

void stats_wilson(long k, long n, double z, double *lo, double *hi) {
    if (n <= 0) {
        *lo = 0, *hi = 1;
        return;
    }
    double p = (double)k / n, z2 = z * z, den = 1 + z2 / n;
    double mid = (p + z2 / (2.0 * n)) / den;
    double half = z * sqrt(p * (1 - p) / n + z2 / (4.0 * n * n)) / den;
    *lo = fmax(0, mid - half), *hi = fmin(1, mid + half);
}

// ln C(n, k) through lgamma: exact enough for p-values (relative error ~1e-13).
static double log_choose(long n, long k) { return lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0); }

double stats_mcnemar_exact(long b, long c) {
    long n = b + c, m = b < c ? b : c;
    if (n <= 0) return 1;
    double tail = 0;
    for (long i = 0; i <= m; i++) tail += exp(log_choose(n, i) - n * M_LN2);
    double p = 2 * tail;
    return p > 1 ? 1 : p;
}

void stats_paired_diff(long a, long b, long c, long d, double z, double *lo, double *hi) {
    long n = a + b + c + d;
    if (n <= 0) {
        *lo = -1, *hi = 1;
        return;
    }
    double p1 = (double)(a + b) / n, p2 = (double)(a + c) / n, diff = p1 - p2;
    double l1, u1, l2, u2;
    stats_wilson(a + b, n, z, &l1, &u1);
    stats_wilson(a + c, n, z, &l2, &u2);
    double margins = (double)(a + b) * (c + d) * (a + c) * (b + d);
    double phi = margins > 0 ? ((double)a * d - (double)b * c) / sqrt(margins) : 0;
    double dl = (p1 - l1) * (p1 - l1) - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) * (u2 - p2);
    double du = (u1 - p1) * (u1 - p1) - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) * (p2 - l2);
    *lo = fmax(-1, diff - sqrt(fmax(0, dl)));
    *hi = fmin(1, diff + sqrt(fmax(0, du)));
}

double stats_quantile(const double *sorted, long n, double q) {
    if (n <= 0) return NAN;
    double pos = q * (n - 1);
    long i = (long)floor(pos);
    if (i >= n - 1) return sorted[n - 1];
    if (i < 0) return sorted[0];
    double f = pos - i;
    return sorted[i] + f * (sorted[i + 1] - sorted[i]);
}

double stats_rank(const double *sorted, long n, double x) {
    long lo = 0, hi = n;  // first index with sorted[i] >= x
    while (lo < hi) {
        long mid = lo + (hi - lo) / 2;
        if (sorted[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return n > 0 ? (double)lo / n : NAN;
}

static int cmp_double(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    if (isnan(a) || isnan(b)) return isnan(a) - isnan(b);
    return (a > b) - (a < b);
}

void stats_sort(double *x, long n) { qsort(x, (size_t)n, sizeof *x, cmp_double); }

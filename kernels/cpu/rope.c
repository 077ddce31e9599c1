// rope.c: rotary position embedding, in place.
#include <math.h>

#include "kernels/ops.h"

void cpu_rope_table(float *tab, const float *inv_freq, int half, int n_pos) {
    for (int p = 0; p < n_pos; p++)
        for (int i = 0; i < half; i++) {
            float angle = (float)p * inv_freq[i];
            float *e = tab + ((size_t)p * half + i) * 2;
            e[0] = cosf(angle);
            e[1] = sinf(angle);
        }
}

void cpu_rope(float *x, const int *pos, int T, int n_heads, int head_dim, const float *inv_freq,
              int interleaved) {
    int half = head_dim / 2;
    for (int t = 0; t < T; t++) {
        float c[half], s[half];
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[t] * inv_freq[i];  // fp32 product, as HF computes it
            c[i] = cosf(angle), s[i] = sinf(angle);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                // rotate-half pairs element i with i + half; interleaved pairs 2i with 2i+1
                int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
                float x0 = v[a], x1 = v[b];
                v[a] = x0 * c[i] - x1 * s[i];
                v[b] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}

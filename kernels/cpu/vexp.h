// vexp.h: e^x on a GCC vector, for the CPU kernels that exponentiate many values at
// once (attention's softmax, SwiGLU). The includer defines ATT_V (float lanes), ATT_VI
// (int lanes of the same count) and ATT_FN(name); it may be included once per ISA.

// e^x lane-wise for x <= 0: |rel err| < 3e-7 down to -87, 0 below (and at -inf).
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, then the degree-6 Taylor polynomial.
static inline __attribute__((always_inline)) ATT_V ATT_FN(vexp)(ATT_V x) {
    ATT_VI under = x < -87.0f;  // lanes of -1 where the result is 0
    ATT_V xc = (ATT_V)(((ATT_VI)x & ~under) | ((ATT_VI)((ATT_V){ 0 } - 87.0f) & under));
    ATT_VI ni = __builtin_convertvector(xc * 1.44269504f - 0.5f, ATT_VI);  // round: x <= 0
    ATT_V n = __builtin_convertvector(ni, ATT_V);
    ATT_V r = xc - n * 0.693145752f - n * 1.42860677e-6f;
    ATT_V p = (ATT_V){ 0 } + 1.0f / 720;
    p = p * r + 1.0f / 120, p = p * r + 1.0f / 24, p = p * r + 1.0f / 6, p = p * r + 0.5f;
    p = p * r + 1.0f, p = p * r + 1.0f;
    ATT_VI scale = (ni + 127) << 23;  // 2^n as float bits
    return (ATT_V)((ATT_VI)(p * (ATT_V)scale) & ~under);
}

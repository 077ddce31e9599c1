// defaults.h: the sampling defaults of `varent run`, `varent chat` and `varent serve`
// (for a request that omits a field): one set, documented in docs/cli.md (generated
// from the option tables, which print these through GEN_STR).
#ifndef VARENT_DEFAULTS_H
#define VARENT_DEFAULTS_H

#define GEN_DEFAULT_TEMP 0.7
#define GEN_DEFAULT_TOP_K 0
#define GEN_DEFAULT_TOP_P 0.9
#define GEN_DEFAULT_MIN_P 0

#define GEN_STR_(x) #x
#define GEN_STR(x) GEN_STR_(x)

#endif

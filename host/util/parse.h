// parse.h: the strict reading of a decimal index inside a name or a list ("blk.12.",
// "direction.3", "--dump-layers 0,5-7"). strtol would take " 2", "+2" and "02 " too,
// so "direction. 2" read as layer 2; here only ASCII digits count.
#ifndef VARENT_PARSE_H
#define VARENT_PARSE_H

// One or more ASCII digits at s, their value at most max (no sign, no space): the end
// of the digits with *out, or NULL.
const char *parse_index(const char *s, long max, long *out);

#endif

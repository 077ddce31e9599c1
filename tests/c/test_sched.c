// test_sched.c: the scheduler against generate() on the CPU (tests/c/sched_cases.h).
#include "sched_cases.h"

// devices.h: the --devices list and one worker thread per device. Each device holds
// its own model replica (a session opened on that device's thread), and everything
// that touches a replica runs on its thread, so a backend with per-thread device
// state (CUDA) sees one device per thread. Threads exchange only what the caller
// passes through its own structs (token ids and entropies for the agents).
#ifndef VARENT_DEVICES_H
#define VARENT_DEVICES_H

#include "host/util/err.h"
#include "host/runtime/session.h"

#define DEVICES_MAX 16

typedef struct {
    char name[32];  // "cpu" or "cuda:N": the session_opts.device string
} device_spec;

// "cpu", "cuda", "cuda:N" or a bare GPU index "N", comma-separated; repeated entries
// are separate replicas. Returns the count (1..DEVICES_MAX) or -1 with err naming
// the entry and its offset.
int devices_parse(const char *list, device_spec *out, verr *err);

typedef struct dev_pool dev_pool;
// fn runs on a device's thread with that device's index.
typedef void (*dev_job)(void *ud, int dev);

// Starts n threads (n == 1: no thread, jobs run on the caller).
int dev_pool_start(dev_pool **p, int n, verr *err);
// Runs fn on the threads of the devices in mask (bit d: device d) and waits for all.
void dev_pool_run(dev_pool *p, unsigned mask, dev_job fn, void *ud);
void dev_pool_stop(dev_pool *p);
int dev_pool_size(const dev_pool *p);

// Opens a session per device in mask, each on its own thread, in parallel:
// sessions[d] from o with o->device replaced by specs[d].name. On failure every
// opened one is closed again and err names the first failing device.
int devices_open(dev_pool *p, unsigned mask, const device_spec *specs, const session_opts *o, session *sessions,
                 verr *err);

#endif

// test_outfile: the rules of host/util/outfile.h at the level of the module, for what
// the command-line matrix (tests/py/test_nothing_lost.py) cannot reach: a name that
// appears between open and commit, planted links in a server's capture directory, the
// names of partial outputs, descriptors by name, stale temporary files and the notices.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "host/util/outfile.h"
#include "tests/c/check.h"

static char dir[4096], notices[8192];

static void on_notice(const char *msg) {
    size_t n = strlen(notices);
    snprintf(notices + n, sizeof notices - n, "%s\n", msg);
}

static const char *at(const char *name) {
    static char buf[4][4200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

// The bytes of a file ("" if missing), for comparisons.
static const char *get(const char *path) {
    static char buf[4096];
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static int temps_left(void) {
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -q '\\.tmp\\.'", dir);
    return system(cmd) == 0;
}

// The server's captures (opts.fresh): never through a link, never over a name that
// appears meanwhile.
static void fresh_names(void) {
    outfile_opts fresh = { .fresh = 1 };
    outfile o;
    verr err;
    put(at("victim"), "victim\n");
    symlink("victim", at("planted.st"));
    int rc = outfile_open(&o, at("planted.st"), &fresh, &err);
    CHECK(rc == -1 && strstr(err.msg, "File exists") && !strcmp(get(at("victim")), "victim\n"),
          "fresh_refuses_a_planted_link", "rc %d: %s", rc, err.msg);
    rc = outfile_open(&o, at("cap.st"), &fresh, &err);
    if (rc == 0) fputs("capture\n", o.f);
    put(at("cap.st"), "appeared\n");  // another writer took the name meanwhile
    int crc = rc == 0 ? outfile_commit(&o, &err) : -1;
    CHECK(rc == 0 && crc == -1 && !strcmp(get(at("cap.st")), "appeared\n") && !temps_left(),
          "fresh_never_replaces_a_name_that_appeared", "rc %d commit %d: %s", rc, crc, err.msg);
    rc = outfile_open(&o, at("cap2.st"), &fresh, &err);
    if (rc == 0) fputs("capture\n", o.f);
    crc = rc == 0 ? outfile_commit(&o, &err) : -1;
    CHECK(crc == 0 && !strcmp(get(at("cap2.st")), "capture\n"), "fresh_writes_a_new_name", "%s", err.msg);
}

// OUTFILE_PARTIAL: a file that existed stays; the part goes to NAME.partial.EXT, then
// NAME.partial-2.EXT, named in a notice. A new name gets it where it belongs.
static void partial_outputs(void) {
    put(at("log.jsonl"), "KEEP\n");
    outfile_opts force = { .records = 1, .force = 1, .flag = "--metrics-out" };
    for (int k = 1; k <= 2; k++) {
        outfile o;
        verr err;
        notices[0] = 0;
        int rc = outfile_open(&o, at("log.jsonl"), &force, &err);
        if (rc == 0) fputs("{\"pos\":1}\n", o.f);
        int frc = rc == 0 ? outfile_finish(&o, OUTFILE_PARTIAL, &err) : -1;
        const char *want = at(k == 1 ? "log.partial.jsonl" : "log.partial-2.jsonl");
        CHECK(frc == 0 && !strcmp(get(at("log.jsonl")), "KEEP\n") && !strcmp(get(want), "{\"pos\":1}\n") &&
                  !strcmp(outfile_where(&o), want) && strstr(notices, want) && !temps_left(),
              k == 1 ? "partial_of_existing_goes_beside" : "partial_again_gets_the_next_name", "rc %d/%d %s | %s", rc,
              frc, err.msg, notices);
    }
    outfile o;
    verr err;
    int rc = outfile_open(&o, at("new.safetensors"), NULL, &err);
    if (rc == 0) fputs("part\n", o.f);
    int frc = rc == 0 ? outfile_finish(&o, OUTFILE_PARTIAL, &err) : -1;
    CHECK(frc == 0 && !strcmp(get(at("new.safetensors")), "part\n") && !o.kept[0], "partial_of_a_new_name_in_place",
          "%d %s", frc, err.msg);
    rc = outfile_open(&o, at("dropped.bin"), NULL, &err);
    outfile_abort(&o);
    CHECK(rc == 0 && access(at("dropped.bin"), F_OK) != 0 && !temps_left(), "drop_leaves_nothing", "%s", err.msg);
}

// /dev/fd/N of a file a shell opened with `>>`: written through the descriptor (shared
// offset, O_APPEND kept), never renamed; a pipe's too.
static void descriptors(void) {
    put(at("app.log"), "old\n");
    int fd = open(at("app.log"), O_WRONLY | O_APPEND);
    char name[64];
    snprintf(name, sizeof name, "/dev/fd/%d", fd);
    verr err;
    int rc = outfile_write_all(name, "new\n", 4, &err);
    CHECK(rc == 0 && !strcmp(get(at("app.log")), "old\nnew\n"), "dev_fd_of_an_append_appends", "%d %s: '%s'", rc,
          err.msg, get(at("app.log")));
    snprintf(name, sizeof name, "/proc/self/fd/%d", fd);
    rc = outfile_write_all(name, "more\n", 5, &err);
    CHECK(rc == 0 && !strcmp(get(at("app.log")), "old\nnew\nmore\n"), "proc_self_fd_appends", "%s", err.msg);
    close(fd);
    int p[2];
    if (pipe(p) == 0) {
        snprintf(name, sizeof name, "/dev/fd/%d", p[1]);
        rc = outfile_write_all(name, "piped", 5, &err);
        char buf[16] = { 0 };
        ssize_t n = read(p[0], buf, sizeof buf - 1);
        CHECK(rc == 0 && n == 5 && !strcmp(buf, "piped"), "dev_fd_of_a_pipe", "%d %s", rc, err.msg);
        close(p[0]), close(p[1]);
    }
    snprintf(name, sizeof name, "/dev/fd/%d", 900);
    rc = outfile_write_all(name, "x", 1, &err);
    CHECK(rc == -1 && strstr(err.msg, "not open"), "dev_fd_not_open", "%s", err.msg);
    outfile zero = { 0 };
    outfile_abort(&zero);  // a zero-initialised outfile holds no descriptor: fd 0 stays
    CHECK(fcntl(0, F_GETFD) >= 0 || errno != EBADF, "abort_of_zero_outfile_keeps_fd_0", "stdin was closed");
}

// NAME.tmp.PID of a dead process, this user's: removed with a notice; a live PID's, or
// another name's, stays.
static void stale_temps(void) {
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char stale[64], live[64], other[64];
    snprintf(stale, sizeof stale, "doc.bin.tmp.%d", (int)dead);
    snprintf(live, sizeof live, "doc.bin.tmp.%d", (int)getppid());
    snprintf(other, sizeof other, "doc.binx.tmp.%d", (int)dead);
    put(at(stale), "stale"), put(at(live), "live"), put(at(other), "other");
    notices[0] = 0;
    verr err;
    int rc = outfile_write_all(at("doc.bin"), "doc", 3, &err);
    CHECK(rc == 0 && access(at(stale), F_OK) != 0 && strstr(notices, stale) && access(at(live), F_OK) == 0 &&
              access(at(other), F_OK) == 0,
          "stale_temp_removed_others_kept", "%d %s | %s", rc, err.msg, notices);
    unlink(at(live)), unlink(at(other));
}

// A link in a sticky world-writable directory that belongs to another user: refused,
// as fs.protected_symlinks would (needs root to make the other user's link).
static void sticky_links(void) {
    if (geteuid() != 0) return (void)SKIP("sticky_foreign_link_refused", "not root: no link of another user");
    mkdir(at("sticky"), 0777);
    chmod(at("sticky"), 01777);
    put(at("target"), "target\n");
    symlink("../target", at("sticky/out"));
    lchown(at("sticky/out"), 65534, 65534);
    verr err;
    int rc = outfile_write_all(at("sticky/out"), "x", 1, &err);
    CHECK(rc == -1 && strstr(err.msg, "protected_symlinks") && !strcmp(get(at("target")), "target\n"),
          "sticky_foreign_link_refused", "%d %s", rc, err.msg);
    lchown(at("sticky/out"), 0, 0);  // one's own link there is followed
    rc = outfile_write_all(at("sticky/out"), "mine\n", 5, &err);
    CHECK(rc == 0 && !strcmp(get(at("target")), "mine\n"), "sticky_own_link_followed", "%d %s", rc, err.msg);
}

int main(void) {
    const char *tmp = getenv("TESTTMP");
    snprintf(dir, sizeof dir, "%s/outfile-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return printf("FAIL outfile_setup: mkdtemp: %s\n", strerror(errno)), 1;
    outfile_set_notice(on_notice);
    fresh_names();
    partial_outputs();
    descriptors();
    stale_temps();
    sticky_links();
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (!check_failures && system(cmd) != 0) printf("# could not remove %s\n", dir);
    CHECK_DONE();
}

/* powercut: an LD_PRELOAD model of a disk that loses everything not fsynced when the power goes.
 *
 * The model: a file's durable content is what it held when its last completed fsync (or
 * fdatasync) began; a file never synced under the model keeps the content it had when first
 * opened under it (empty, for a file it created). The test cuts the power by SIGKILLing the
 * processes and writing each file's durable content back over it (tests/common/powercut.rs).
 *
 * How: every regular file opened below $POWERCUT_ROOT is tracked by inode. Its durable copy is
 * $POWERCUT_STATE/<dev>-<ino>.durable, made at first open; every write and truncation appends
 * the byte range it touched to <dev>-<ino>.dirty; an fsync copies those ranges from the file
 * (the page cache, shared by every process) into the durable copy. <dev>-<ino>.path names the
 * file for the cut. The dirty log is taken shared by writers and exclusively by a sync, so a
 * write that completed before a sync began is always in it; processes and forks each open
 * their own descriptors of it (flock belongs to the open file description).
 *
 * Not modelled: directory entries (creating, renaming and unlinking files are durable at once),
 * writes through mmap (SQLite maps only its -shm file, which it rebuilds), sync(2)/syncfs(2),
 * sync_file_range(2) (PostgreSQL's writeback hint: it promises nothing).
 *
 * Knobs: $POWERCUT_SYNC_DELAY_US makes each sync take that long (a real disk's latency, which
 * widens the windows a loss needs); while $POWERCUT_STATE/fail-sync exists, a sync of a tracked
 * file whose path ends with that file's content fails with EIO instead (a failing disk).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FDS 65536

struct tracked {
    int active;
    pid_t pid;      /* the process that opened `dirty` (a fork opens its own) */
    int dirty;      /* this process's descriptor of the inode's dirty log */
    char key[64];   /* <dev>-<ino> */
    char path[PATH_MAX];
};

static struct tracked fds[MAX_FDS];
static int highest_fd = -1; /* no entry above it was ever tracked */
static char root[PATH_MAX];
static size_t root_len;
static char state[PATH_MAX];
static long sync_delay_us;
static int enabled = -1;

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_fallocate)(int, int, off_t, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);

static void die(const char *what) {
    char line[512];
    int n = snprintf(line, sizeof line, "powercut: %s: %s\n", what, strerror(errno));
    (void)!write(2, line, (size_t)n);
    abort();
}

/* A fork inherits its parent's descriptors of the dirty logs; the child opens its own when it
 * writes, so the inherited ones are closed at once (a server that forks a process per
 * connection, as PostgreSQL does, ran out of descriptors). */
static void forked_child(void) {
    for (int fd = 0; fd <= highest_fd; fd++) {
        if (fds[fd].pid != 0) real_close(fds[fd].dirty);
        fds[fd].pid = 0;
    }
}

__attribute__((constructor)) static void init(void) {
    if (enabled != -1) return;
    pthread_atfork(NULL, NULL, forked_child);
    real_open = dlsym(RTLD_NEXT, "open");
    real_openat = dlsym(RTLD_NEXT, "openat");
    real_close = dlsym(RTLD_NEXT, "close");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_pwritev = dlsym(RTLD_NEXT, "pwritev");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_fallocate = dlsym(RTLD_NEXT, "fallocate");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_renameat = dlsym(RTLD_NEXT, "renameat");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    real_unlinkat = dlsym(RTLD_NEXT, "unlinkat");
    const char *r = getenv("POWERCUT_ROOT"), *s = getenv("POWERCUT_STATE");
    const char *d = getenv("POWERCUT_SYNC_DELAY_US");
    sync_delay_us = d ? atol(d) : 0;
    if (!r || !s || !realpath(r, root) || !realpath(s, state)) {
        enabled = 0;
        return;
    }
    root_len = strlen(root);
    enabled = 1;
}

static void state_file(char *out, const char *key, const char *suffix) {
    snprintf(out, PATH_MAX, "%s/%s.%s", state, key, suffix);
}

/* Copies `len` bytes at `off` from `from` to `to` (short at the end of `from`). */
static void copy_range(int from, int to, off_t off, off_t len) {
    char buf[65536];
    while (len > 0) {
        ssize_t n = pread(from, buf, len < (off_t)sizeof buf ? (size_t)len : sizeof buf, off);
        if (n < 0) die("pread");
        if (n == 0) return;
        if (real_pwrite(to, buf, (size_t)n, off) != n) die("pwrite of the durable copy");
        off += n;
        len -= n;
    }
}

/* A descriptor to read `fd`'s file through: `fd` itself, unless it was opened write-only. The
 * extra descriptor is closed after, which drops the process's POSIX locks on the file; only a
 * write-only file needs it (PostgreSQL's copies; SQLite opens its files read-write). */
static int readable(int fd) {
    if ((fcntl(fd, F_GETFL) & O_ACCMODE) != O_WRONLY) return fd;
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int r = real_open(link, O_RDONLY | O_CLOEXEC);
    if (r < 0) die("open for reading");
    return r;
}

static void done_reading(int fd, int r) {
    if (r != fd) real_close(r);
}

static int dirty_log(int fd) {
    struct tracked *t = &fds[fd];
    if (t->pid != getpid()) {
        char path[PATH_MAX];
        state_file(path, t->key, "dirty");
        t->dirty = real_open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (t->dirty < 0) die("open of a dirty log");
        t->pid = getpid();
    }
    return t->dirty;
}

/* Starts tracking `fd` if it is a regular file below the root. */
static void track(int fd) {
    if (fd < 0 || fd >= MAX_FDS || !enabled) return;
    fds[fd].active = 0;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return;
    path[n] = 0;
    if (strncmp(path, root, root_len) != 0 || (path[root_len] != '/' && path[root_len] != 0)) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    struct tracked *t = &fds[fd];
    if (fd > highest_fd) highest_fd = fd;
    snprintf(t->key, sizeof t->key, "%llu-%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    strcpy(t->path, path);
    t->pid = 0;
    int log = dirty_log(fd);
    flock(log, LOCK_EX);
    char durable[PATH_MAX];
    state_file(durable, t->key, "durable");
    int copy = real_open(durable, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (copy >= 0) {
        int r = readable(fd);
        copy_range(r, copy, 0, st.st_size);
        done_reading(fd, r);
        real_close(copy);
    } else if (errno != EEXIST) {
        die("create of a durable copy");
    }
    char name[PATH_MAX];
    state_file(name, t->key, "path");
    int named = real_open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (named < 0) die("open of a path record");
    (void)!real_write(named, path, strlen(path));
    real_close(named);
    flock(log, LOCK_UN);
    t->active = 1;
}

static int is_tracked(int fd) { return fd >= 0 && fd < MAX_FDS && fds[fd].active; }

/* Records that [off, off+len) changed; len = -1: everything from off on (a truncation). */
static void mark_dirty(int fd, off_t off, off_t len) {
    int64_t range[2] = {off, len};
    (void)!real_write(dirty_log(fd), range, sizeof range);
}

/* A write: run under the shared lock, then recorded, so a sync sees it whole or not at all. */
#define WRITE_TRACKED(fd, off, call)                                  \
    do {                                                              \
        int log_ = dirty_log(fd);                                     \
        flock(log_, LOCK_SH);                                         \
        ssize_t n_ = (call);                                          \
        if (n_ > 0) mark_dirty(fd, (off), n_);                        \
        flock(log_, LOCK_UN);                                         \
        return n_;                                                    \
    } while (0)

static int failing_sync(int fd) {
    char trigger[PATH_MAX], suffix[PATH_MAX];
    snprintf(trigger, sizeof trigger, "%s/fail-sync", state);
    int f = real_open(trigger, O_RDONLY | O_CLOEXEC);
    if (f < 0) return 0;
    ssize_t n = read(f, suffix, sizeof suffix - 1);
    real_close(f);
    if (n <= 0) return 0;
    suffix[n] = 0;
    size_t plen = strlen(fds[fd].path), slen = (size_t)n;
    return plen >= slen && strcmp(fds[fd].path + plen - slen, suffix) == 0;
}

/* Makes what `fd`'s file holds now its durable content. */
static int make_durable(int fd) {
    if (sync_delay_us > 0) usleep((useconds_t)sync_delay_us);
    if (failing_sync(fd)) {
        errno = EIO;
        return -1;
    }
    struct tracked *t = &fds[fd];
    int log = dirty_log(fd);
    flock(log, LOCK_EX);
    char path[PATH_MAX];
    state_file(path, t->key, "dirty");
    int ranges = real_open(path, O_RDWR | O_CLOEXEC);
    state_file(path, t->key, "durable");
    int copy = real_open(path, O_WRONLY | O_CLOEXEC);
    if (ranges < 0 || copy < 0) {
        /* Unlinked since it was opened: what it holds no longer matters. */
        if (errno != ENOENT) die("open at sync");
        if (ranges >= 0) real_close(ranges);
        if (copy >= 0) real_close(copy);
        flock(log, LOCK_UN);
        return 0;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) die("fstat at sync");
    int64_t range[2];
    int r = readable(fd);
    while (read(ranges, range, sizeof range) == (ssize_t)sizeof range) {
        off_t len = range[1] < 0 ? st.st_size - range[0] : range[1];
        if (len > 0) copy_range(r, copy, range[0], len);
    }
    done_reading(fd, r);
    if (real_ftruncate(copy, st.st_size) != 0) die("ftruncate of the durable copy");
    if (real_ftruncate(ranges, 0) != 0) die("ftruncate of a dirty log");
    real_close(copy);
    real_close(ranges);
    flock(log, LOCK_UN);
    return 0;
}

/* A file unlinked, or replaced by a rename: its records go (directory changes are durable). */
static void forget_path(int dirfd, const char *name) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) || st.st_nlink > 1)
        return;
    char key[64], path[PATH_MAX];
    snprintf(key, sizeof key, "%llu-%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    const char *suffixes[] = {"durable", "path", "dirty"};
    for (int i = 0; i < 3; i++) {
        state_file(path, key, suffixes[i]);
        real_unlink(path);
    }
}

/* A file renamed: tracking it again records its new path. */
static void renamed(int dirfd, const char *name) {
    int fd = real_openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    track(fd);
    if (fd >= 0) close(fd);
}

static mode_t mode_of(int flags, va_list args) {
    return ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) ? (mode_t)va_arg(args, int) : 0;
}

int openat(int dirfd, const char *path, int flags, ...) {
    init();
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    /* Truncation changes content: the durable copy is taken first, then the file truncated. */
    int fd = real_openat(dirfd, path, flags & ~O_TRUNC, mode);
    track(fd);
    if (fd >= 0 && (flags & O_TRUNC)) {
        if (is_tracked(fd)) mark_dirty(fd, 0, -1);
        real_ftruncate(fd, 0);
    }
    return fd;
}
int open(const char *path, int flags, ...) {
    va_list args;
    va_start(args, flags);
    mode_t mode = mode_of(flags, args);
    va_end(args);
    return openat(AT_FDCWD, path, flags, mode);
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));
int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

int close(int fd) {
    init();
    if (fd >= 0 && fd < MAX_FDS) {
        if (fds[fd].pid == getpid()) real_close(fds[fd].dirty);
        fds[fd].active = 0;
        fds[fd].pid = 0;
    }
    return real_close(fd);
}

ssize_t write(int fd, const void *buf, size_t count) {
    init();
    if (!is_tracked(fd)) return real_write(fd, buf, count);
    off_t at = (fcntl(fd, F_GETFL) & O_APPEND) ? lseek(fd, 0, SEEK_END) : lseek(fd, 0, SEEK_CUR);
    WRITE_TRACKED(fd, at, real_write(fd, buf, count));
}
ssize_t pwrite(int fd, const void *buf, size_t count, off_t off) {
    init();
    if (!is_tracked(fd)) return real_pwrite(fd, buf, count, off);
    WRITE_TRACKED(fd, off, real_pwrite(fd, buf, count, off));
}
ssize_t pwrite64(int fd, const void *buf, size_t count, off_t off) __attribute__((alias("pwrite")));
ssize_t writev(int fd, const struct iovec *iov, int n) {
    init();
    if (!is_tracked(fd)) return real_writev(fd, iov, n);
    off_t at = lseek(fd, 0, SEEK_CUR);
    WRITE_TRACKED(fd, at, real_writev(fd, iov, n));
}
ssize_t pwritev(int fd, const struct iovec *iov, int n, off_t off) {
    init();
    if (!is_tracked(fd)) return real_pwritev(fd, iov, n, off);
    WRITE_TRACKED(fd, off, real_pwritev(fd, iov, n, off));
}
ssize_t pwritev64(int fd, const struct iovec *iov, int n, off_t off) __attribute__((alias("pwritev")));

int ftruncate(int fd, off_t length) {
    init();
    if (!is_tracked(fd)) return real_ftruncate(fd, length);
    int log = dirty_log(fd);
    flock(log, LOCK_SH);
    int rc = real_ftruncate(fd, length);
    if (rc == 0) mark_dirty(fd, length, -1);
    flock(log, LOCK_UN);
    return rc;
}
int ftruncate64(int fd, off_t length) __attribute__((alias("ftruncate")));
int fallocate(int fd, int mode, off_t off, off_t len) {
    init();
    if (!is_tracked(fd)) return real_fallocate(fd, mode, off, len);
    int log = dirty_log(fd);
    flock(log, LOCK_SH);
    int rc = real_fallocate(fd, mode, off, len);
    if (rc == 0) mark_dirty(fd, off, len);
    flock(log, LOCK_UN);
    return rc;
}
int fallocate64(int fd, int mode, off_t off, off_t len) __attribute__((alias("fallocate")));

int fsync(int fd) {
    init();
    return is_tracked(fd) ? make_durable(fd) : real_fsync(fd);
}
int fdatasync(int fd) {
    init();
    return is_tracked(fd) ? make_durable(fd) : real_fdatasync(fd);
}

int renameat(int olddir, const char *old, int newdir, const char *new) {
    init();
    if (enabled) forget_path(newdir, new);
    int rc = real_renameat(olddir, old, newdir, new);
    if (rc == 0 && enabled) renamed(newdir, new);
    return rc;
}
int rename(const char *old, const char *new) { return renameat(AT_FDCWD, old, AT_FDCWD, new); }
int unlinkat(int dirfd, const char *path, int flags) {
    init();
    if (enabled && !(flags & AT_REMOVEDIR)) forget_path(dirfd, path);
    return real_unlinkat(dirfd, path, flags);
}
int unlink(const char *path) { return unlinkat(AT_FDCWD, path, 0); }

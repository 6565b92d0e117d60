/* slow-fsync: an LD_PRELOAD library that makes every fsync and fdatasync of the process take
 * $SLOW_FSYNC_US microseconds longer, sleeping after the real call: a slower disk, as many cloud
 * volumes are, for bench/run.sh's slow-disk case. Build: cc -O2 -shared -fPIC -o slow-fsync.so
 * slow-fsync.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

/* Keeps the real call's errno: a failed sync must still say why. */
static void sleep_as_configured(void) {
    int saved = errno;
    const char *value = getenv("SLOW_FSYNC_US");
    if (value) usleep((useconds_t)atoi(value));
    errno = saved;
}

/* The real call, then the sleep. */
#define SLOWED(name)                                                      \
    int name(int fd) {                                                    \
        static int (*real)(int);                                          \
        if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, #name);          \
        int result = real(fd);                                            \
        sleep_as_configured();                                            \
        return result;                                                    \
    }

SLOWED(fsync)
SLOWED(fdatasync)

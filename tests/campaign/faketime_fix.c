/* Preloaded before Debian's libfaketime 0.9.10 for the campaign's clock-skewed processes.
 * With FAKETIME_DONT_FAKE_MONOTONIC=1 its clock_nanosleep still rewrites an absolute
 * CLOCK_MONOTONIC deadline as if it were a faked one, into a negative time, so every
 * time.sleep() of Python >= 3.11 fails with EINVAL (libfaketime issue 426). The monotonic
 * clock is not faked here, so such a sleep goes to the kernel as it is; any other clock
 * goes on to libfaketime. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_nanosleep_fn)(clockid_t, int, const struct timespec *, struct timespec *);

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *req,
                    struct timespec *rem)
{
    if (clock_id == CLOCK_MONOTONIC || clock_id == CLOCK_BOOTTIME) {
        if (syscall(SYS_clock_nanosleep, clock_id, flags, req, rem) == -1)
            return errno;
        return 0;
    }
    clock_nanosleep_fn next = (clock_nanosleep_fn)dlsym(RTLD_NEXT, "clock_nanosleep");
    return next ? next(clock_id, flags, req, rem) : ENOSYS;
}

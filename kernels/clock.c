/* clock.c - monotonic milliseconds and sleeping. */
#include "kernels/clock.h"

#include <time.h>

double ts_clock_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void ts_sleep_ms(double ms) {
    if (ms <= 0) return;
    long long ns = (long long)(ms * 1e6);
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    nanosleep(&ts, NULL);
}

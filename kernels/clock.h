/* clock.h - the monotonic clock in milliseconds, and sleeping, for step
 * timings, timeouts and deadlines in every room. */
#ifndef TS_CLOCK_H
#define TS_CLOCK_H

/* Milliseconds of CLOCK_MONOTONIC (an arbitrary origin, never set back). */
double ts_clock_ms(void);

/* Sleeps ms milliseconds (nothing when ms <= 0). */
void ts_sleep_ms(double ms);

#endif

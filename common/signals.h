/* signals: the one way every binary stops on a signal — the handler only
 * sets a flag that the main loop polls (nothing else is safe in a handler);
 * SIGPIPE is ignored so a closed pipe or socket is an error return, not a
 * death. */
#ifndef DP_SIGNALS_H
#define DP_SIGNALS_H

#include <signal.h>

/* SIGINT and SIGTERM (and SIGHUP when hup: the launcher, so a closed
 * terminal still stops its children in order) store the signal's number
 * in *flag. One flag per process: a second call replaces the first. */
void dp_signals_install(volatile sig_atomic_t *flag, int hup);

/* SIGHUP stores 1 in *flag instead (a daemon's "read your files again":
 * downpour-ps's allow list); the loop clears it. */
void dp_signals_reload(volatile sig_atomic_t *flag);

#endif

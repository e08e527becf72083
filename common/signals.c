/* signals: dp_signals_install, dp_signals_reload (see signals.h). */
#include "common/signals.h"

#include <string.h>

static volatile sig_atomic_t *s_flag, *s_reload;

static void s_on_signal(int sig)
{
    *s_flag = sig;
}

static void s_on_reload(int sig)
{
    (void)sig;
    *s_reload = 1;
}

/* sig calls fn from now on. */
static void s_handle(int sig, void (*fn)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
}

void dp_signals_reload(volatile sig_atomic_t *flag)
{
    s_reload = flag;
    s_handle(SIGHUP, s_on_reload);
}

void dp_signals_install(volatile sig_atomic_t *flag, int hup)
{
    s_flag = flag;
    s_handle(SIGINT, s_on_signal);
    s_handle(SIGTERM, s_on_signal);
    if (hup) s_handle(SIGHUP, s_on_signal);
    signal(SIGPIPE, SIG_IGN);
}

/* signals: dp_signals_install (see signals.h). */
#include "common/signals.h"

#include <string.h>

static volatile sig_atomic_t *s_flag;

static void s_on_signal(int sig)
{
    *s_flag = sig;
}

static volatile sig_atomic_t *s_reload;

static void s_on_reload(int sig)
{
    (void)sig;
    *s_reload = 1;
}

void dp_signals_reload(volatile sig_atomic_t *flag)
{
    s_reload = flag;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_reload;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGHUP, &sa, NULL);
}

void dp_signals_install(volatile sig_atomic_t *flag, int hup)
{
    s_flag = flag;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (hup) sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

/* signals: dp_signals_install (see signals.h). */
#include "common/signals.h"

#include <string.h>

static volatile sig_atomic_t *s_flag;

static void s_on_signal(int sig)
{
    *s_flag = sig;
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

/* ps_msgs: the shard's message table — each request type, who may send it
 * (server/loop/auth.h, dp_auth_who_t) and its handler. Admission
 * (dp_ps_admit) reads who, dispatch (server/loop/ps.c) the handler, so a
 * new request type is one row here; a type without a row is not a
 * request, and admission refuses it ("malformed: ... is a reply, not a
 * request"). */
#include "server/loop/ps_loop.h"

static const dp_ps_msg_t s_msgs[] = {
    {DOWNPOUR__MSG_TYPE__HELLO, DP_AUTH_ANYONE, dp_ps_on_hello},
    {DOWNPOUR__MSG_TYPE__PULL, DP_AUTH_WORKER, dp_ps_on_pull},
    {DOWNPOUR__MSG_TYPE__PUSH, DP_AUTH_WORKER, dp_ps_on_push},
    {DOWNPOUR__MSG_TYPE__BARRIER, DP_AUTH_WORKER, dp_ps_on_barrier},
    {DOWNPOUR__MSG_TYPE__ROWS_PULL, DP_AUTH_WORKER, dp_ps_on_rows_pull},
    {DOWNPOUR__MSG_TYPE__ROWS_PUSH, DP_AUTH_WORKER, dp_ps_on_rows_push},
    {DOWNPOUR__MSG_TYPE__HEARTBEAT, DP_AUTH_BEAT, dp_ps_on_heartbeat},
    {DOWNPOUR__MSG_TYPE__STATS, DP_AUTH_CHIEF, dp_ps_on_stats},
    {DOWNPOUR__MSG_TYPE__SHUTDOWN, DP_AUTH_CHIEF, dp_ps_on_shutdown},
};

const dp_ps_msg_t *dp_ps_msg_of(int type)
{
    for (size_t i = 0; i < sizeof s_msgs / sizeof s_msgs[0]; i++)
        if (s_msgs[i].type == type) return &s_msgs[i];
    return NULL;
}

const dp_ps_msg_t *dp_ps_msgs(size_t *n)
{
    *n = sizeof s_msgs / sizeof s_msgs[0];
    return s_msgs;
}

/* spawn: the launcher's children — downpour-ps and downpour-worker processes
 * started beside the running binary, each in its own process group with its
 * output in a log file, killed when the launcher dies. Used by `downpour
 * local`, `downpour launch` (whose workers are any command) and `downpour
 * bench wire`. */
#ifndef DP_SPAWN_H
#define DP_SPAWN_H

#include <stddef.h>
#include <sys/types.h>

/* The directory holding the running binary (where downpour-ps and
 * downpour-worker are); argv0 when /proc/self/exe cannot be read. */
void dp_spawn_bin_dir(char *out, size_t n, const char *argv0);

/* For a launcher, before it starts any child: this process adopts its
 * children's orphans (PR_SET_CHILD_SUBREAPER), and a guard process (its
 * first child, in a process group of its own so that a kill of the
 * launcher's job spares it, ignoring SIGINT and SIGTERM)
 * learns each child's process group as it starts; when this process ends
 * however it ends (SIGKILL included), the guard sends SIGTERM to every
 * group it was not told is empty, then SIGKILL after 10 s; a launcher that
 * exits by itself reaps the guard first (atexit). -1 with err when either
 * cannot be set up. */
int dp_spawn_guard(char *err);

/* Tells the guard that none of group pgid is left (it must not signal it
 * later: the number may be reused). */
void dp_spawn_forget(pid_t pgid);

/* Starts argv (argv[0] a path) with stdout and stderr in log, in a process
 * group of its own, SIGTERM'd if this process dies; *pid on success. */
int dp_spawn(pid_t *pid, const char *const *argv, const char *log, char *err);

/* The same for any command: argv[0] without a slash is looked for on PATH,
 * and env ("NAME=VALUE" strings, NULL-terminated; NULL: none) is added to
 * the environment the child inherits. */
int dp_spawn_env(pid_t *pid, const char *const *argv, const char *const *env, const char *log,
                 char *err);

/* A server's --ready-file, once it is there: the endpoint it bound into
 * out and 1; 0 while there is none yet. */
int dp_spawn_read_ready(const char *ready_file, char *out, size_t n);

/* Waits up to timeout_s for a server's --ready-file and reads the endpoint
 * it bound into out (the server writes it atomically once bound). Fails
 * early, naming log, when the process pid exits first. */
int dp_spawn_wait_ready(const char *ready_file, pid_t pid, const char *log, double timeout_s,
                        char *out, size_t n, char *err);

#endif

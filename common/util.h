/* util: the few things every module needs — error strings, allocation that
 * aborts on out-of-memory, logging, a monotonic clock.
 *
 * Conventions (ARCHITECTURE.md, "Conventions"): fallible calls fill a caller's
 * `char err[DP_ERR_LEN]` and return -1; out-of-memory aborts with the size,
 * so callers never check allocation results. */
#ifndef DP_UTIL_H
#define DP_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Room for the longest line a user can meet whole: an endpoint (up to 255
 * bytes) in front of a server's reply, such as the model-mismatch line with
 * the worker's spec (up to 500 bytes) in it (tests/unit/test_ps.c,
 * fingerprint_mismatch, holds the whole line). */
#define DP_ERR_LEN 1024

/* Format a message into err (may be NULL) and return -1, so that a failing
 * path reads `return dp_err(err, "bad magic %x in %s", m, path);`. */
int dp_err(char *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void *dp_malloc(size_t bytes);
void *dp_calloc(size_t n, size_t size);
void *dp_realloc(void *p, size_t bytes);
char *dp_strdup(const char *s);
/* 64-byte aligned (cache line, AVX-512), freed with free(). */
void *dp_aligned_alloc(size_t bytes);

/* Logging to stderr with a level prefix and the program name set once by
 * dp_log_init. Debug lines are off unless turned on (DP_LOG=debug, read by
 * common/opts.h's dp_log_env). */
void dp_log_init(const char *program);
void dp_log_set_debug(int on);
void dp_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void dp_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void dp_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void dp_log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Checked size arithmetic for sizes that come from input (a spec, a file
 * header): *out = a * b (a + b); -1 when it does not fit in a size_t,
 * *out then unspecified. */
static inline int dp_size_mul(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}
static inline int dp_size_add(size_t a, size_t b, size_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* Seconds on the monotonic clock. */
double dp_now(void);

/* 64-bit FNV-1a over bytes, chained through h (start with DP_FNV_SEED). */
#define DP_FNV_SEED 0xcbf29ce484222325ULL
uint64_t dp_fnv1a(uint64_t h, const void *data, size_t n);

/* mkdir -p: dir and every missing directory above it, each with mode
 * (0755; 0700 for a secret's). Existing directories are left as they are.
 * -1 with err naming the directory that could not be made ("DIR: cannot
 * create: REASON"), or dir when it exists as something else. Every writer
 * of a user's path goes through these, so `--out runs/a/b` or
 * `--save out/m.safetensors` in a fresh directory works, as users expect. */
int dp_mkdirs(const char *dir, mode_t mode, char *err);
/* The directories above path's last component (mkdir -p "$(dirname path)"),
 * mode 0755: for a file about to be created; err names both ("PATH: cannot
 * create its folder DIR: REASON"). */
int dp_mkdir_parents(const char *path, char *err);

/* Whole-file read; returns -1 with err on failure. *out is malloc'd and
 * NUL-terminated (not counted in *len). */
int dp_read_file(const char *path, uint8_t **out, size_t *len, char *err);

/* Atomic file writes, the one way every writer replaces a file (checkpoints,
 * records, keys, ready files): the bytes go to a new temporary file
 * PATH.tmp.XXXXXX in PATH's directory (made first, with the folders above
 * it, when missing: dp_mkdir_parents), created by mkstemp (O_CREAT|O_EXCL:
 * a symlink or file planted at that name is never opened, let alone
 * followed); commit checks every write, fsync and close, sets the mode,
 * renames it over PATH (which replaces a symlink at PATH, never writes
 * through it) and fsyncs the directory. On any failure before the rename
 * nothing is left beside PATH and PATH keeps its previous contents; a
 * failing fsync of the directory, after it, is reported too (PATH then
 * holds the new contents, not known to be durable).
 *
 * Test hooks, read here only: DP_TEST_CRASH_BEFORE_RENAME=TEXT makes the
 * process _exit(3) once a file whose path contains TEXT ("1": any file) is
 * written and synced but not yet renamed (a crash in the middle of a
 * write); DP_TEST_WRITE_FAIL=TEXT makes every write to such a file fail
 * with ENOSPC, as on a full disk. */
typedef struct {
    int fd;              /* the temporary file; -1 once committed or aborted */
    mode_t mode;         /* the file's mode at commit */
    int fail;            /* DP_TEST_WRITE_FAIL matched this path */
    char path[4096];     /* the file replaced */
    char tmp[4096 + 16]; /* path + ".tmp.XXXXXX" */
} dp_atomic_t;

/* Start replacing path (mode: the final file's, e.g. 0644; 0600 for a
 * secret, which then never exists with wider rights). */
int dp_atomic_open(dp_atomic_t *a, const char *path, mode_t mode, char *err);
/* Append len bytes (all of them, or -1 with err). */
int dp_atomic_write(dp_atomic_t *a, const void *data, size_t len, char *err);
/* fsync, close, chmod, rename, fsync the directory; -1 with err (the
 * temporary file then removed). a is closed either way. */
int dp_atomic_commit(dp_atomic_t *a, char *err);
/* Give up: the temporary file is removed. Safe twice. */
void dp_atomic_abort(dp_atomic_t *a);
/* Remove the temporary files an earlier writer of path left when it was
 * killed: only names PATH.tmp.XXXXXX (6 characters of mkstemp's alphabet)
 * that are regular files. The count removed, or -1 with err when the
 * directory does not read. */
int dp_atomic_remove_stale(const char *path, char *err);

/* Whole-file dp_atomic_open / write / commit, mode 0644. */
int dp_write_file_atomic(const char *path, const void *data, size_t len, char *err);
/* The same with the file's mode (0600 for a secret: it is never wider). */
int dp_write_file_atomic_mode(const char *path, const void *data, size_t len, mode_t mode,
                              char *err);

#endif

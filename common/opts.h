/* opts: command lines from one option table per binary — downpour-ps,
 * downpour-worker, `downpour local` and `downpour eval` all parse through
 * dp_opts_parse (getopt_long underneath) and read numbers with the parsers
 * below, so a bad value is refused the same way everywhere: one line naming
 * the flag, what was given and what is accepted; the binaries exit 2.
 *
 * A table entry is a flag's whole story: its name, what kind of value it
 * takes and where that value lands, its line in --help, and whether
 * `downpour local` passes it on to the daemons (DP_OPTS_PASS). The launcher
 * builds its own table from the daemons' tables (dp_ps_options,
 * dp_worker_options), so a flag added to a daemon's table with DP_OPTS_PASS
 * is accepted, checked and forwarded by the launcher without more code. */
#ifndef DP_OPTS_H
#define DP_OPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    DP_OPTS_HEADING = 0, /* not a flag: a section title in --help ("training:") */
    DP_OPTS_FLAG,        /* no value: stores .value into an int */
    DP_OPTS_INT,         /* int in [lo, hi] */
    DP_OPTS_LONG,        /* long in [lo, hi] */
    DP_OPTS_DOUBLE,      /* double in [lo, hi] */
    DP_OPTS_FLOAT,       /* float, read as a double in [lo, hi] */
    DP_OPTS_SEED,        /* uint64_t, the whole range: seeds are never rounded */
    DP_OPTS_STR,         /* const char * into argv */
    DP_OPTS_BUF,         /* copied into a char array of .size bytes (too long: refused) */
    DP_OPTS_CHOICE,      /* one of .choices ("fixed|exp"): its index into an int */
    DP_OPTS_CALL,        /* .set(.arg, value, err) parses it (shapes, names, lists) */
} dp_opt_kind_t;

/* dp_opts_flag_t.pass: `downpour local` accepts this flag and hands it, as given,
 * to every daemon whose table has it. */
#define DP_OPTS_PASS 1

typedef struct {
    const char *name;    /* long name without "--"; a heading's text is in help */
    dp_opt_kind_t kind;
    void *target;        /* where the value lands (type by kind); NULL for CALL */
    double lo, hi;       /* INT, LONG, DOUBLE, FLOAT: the accepted range */
    int value;           /* FLAG: what it stores */
    size_t size;         /* BUF: bytes at target */
    const char *choices; /* CHOICE: "a|b|c" */
    int (*set)(void *arg, const char *value, char *err); /* CALL: -1 with err */
    void *arg;           /* CALL: set's first argument */
    const char *meta;    /* the value's name in --help ("N", "FILE") */
    const char *help;    /* one line (more with "\n") after the flag in --help */
    int pass;            /* DP_OPTS_PASS or 0 */
    const char *given;   /* set by dp_opts_parse: the last value ("" for a FLAG), or NULL */
} dp_opts_flag_t;

/* Entries, one per shape; `pass` is DP_OPTS_PASS or 0 in each. */
#define DP_FLAG_TITLE(text) {.kind = DP_OPTS_HEADING, .help = (text)}
#define DP_FLAG_SET(n, ptr, val, pass_, h)                                      \
    {.name = (n), .kind = DP_OPTS_FLAG, .target = (ptr), .value = (val), .pass = (pass_), .help = (h)}
#define DP_FLAG_NUM(n, kind_, m, ptr, lo_, hi_, pass_, h)                       \
    {.name = (n), .kind = (kind_), .target = (ptr), .lo = (lo_), .hi = (hi_), .meta = (m),    \
     .pass = (pass_), .help = (h)}
#define DP_FLAG_SEED(n, ptr, pass_, h)                                       \
    {.name = (n), .kind = DP_OPTS_SEED, .target = (ptr), .meta = "N", .pass = (pass_), .help = (h)}
#define DP_FLAG_STR(n, m, ptr, pass_, h)                                     \
    {.name = (n), .kind = DP_OPTS_STR, .target = (ptr), .meta = (m), .pass = (pass_), .help = (h)}
#define DP_FLAG_BUF(n, m, array, pass_, h)                                   \
    {.name = (n), .kind = DP_OPTS_BUF, .target = (array), .size = sizeof(array), .meta = (m), \
     .pass = (pass_), .help = (h)}
#define DP_FLAG_CHOICE(n, list, ptr, pass_, h)                                  \
    {.name = (n), .kind = DP_OPTS_CHOICE, .target = (ptr), .choices = (list), .meta = (list), \
     .pass = (pass_), .help = (h)}
#define DP_FLAG_CALL(n, m, fn, a, pass_, h)                                       \
    {.name = (n), .kind = DP_OPTS_CALL, .set = (fn), .arg = (a), .meta = (m), .pass = (pass_), \
     .help = (h)}

#define DP_OPTS_MAX 96

/* One binary's command line: its table and the text around it in --help. */
typedef struct {
    const char *program;  /* "downpour-ps", "downpour local": names it in errors */
    const char *synopsis; /* --help before the flags (usage lines, what it does) */
    const char *epilog;   /* --help after the flags, or NULL */
    dp_opts_flag_t opt[DP_OPTS_MAX];
    int n;
} dp_opts_t;

void dp_opts_init(dp_opts_t *o, const char *program, const char *synopsis, const char *epilog);
/* Append n entries (aborts past DP_OPTS_MAX: a programming error). */
void dp_opts_add(dp_opts_t *o, const dp_opts_flag_t *entries, int n);
/* A table kept as data: a static const array whose entries name where
 * each value lands as an offset (offsetof) into the struct the flags fill,
 * and dp_opts_add_at points them into one such struct. */
typedef struct {
    dp_opts_flag_t flag; /* the entry, target and arg left NULL */
    size_t at;           /* offset of the value (a CALL: of set's argument); unused for a heading */
} dp_opts_entry_t;

/* Append n entries of such a table, each pointing at base + at (the
 * target, or a CALL's arg). */
void dp_opts_add_at(dp_opts_t *o, void *base, const dp_opts_entry_t *entries, int n);
/* The entry named name (without "--"), or NULL. */
dp_opts_flag_t *dp_opts_find(dp_opts_t *o, const char *name);

/* How a command line parsed. BAD is -1 so that a check after the parse
 * may return dp_err's result as one. */
typedef enum {
    DP_OPTS_BAD = -1,       /* one line in err */
    DP_OPTS_PARSED = 0,     /* every flag landed: go on */
    DP_OPTS_HELP_SHOWN = 1, /* -h / --help printed the help: exit 0 */
} dp_opts_result_t;

/* Parse argv[1..argc) (--flag VALUE, --flag=VALUE, the flag's whole name:
 * a prefix of it is an unknown flag; -h and --help print the help to
 * stdout). BAD on an unknown flag, a missing value, a value out of range
 * or malformed, a stray argument. */
dp_opts_result_t dp_opts_parse(dp_opts_t *o, int argc, char **argv, char *err);

/* The exit status for a result other than PARSED: 0 after the help, else 2
 * after "program: err" on stderr — the one place that says how a bad
 * command line ends. */
int dp_opts_exit_status(const char *program, dp_opts_result_t rc, const char *err);

/* --help: synopsis, one line per flag ("--name META  help"), epilog. */
void dp_opts_help(const dp_opts_t *o, FILE *f);

/* The number parsers every flag goes through: the whole text must be the
 * number (no blanks, no trailing junk, decimal), within [lo, hi]; -1 with
 * "--flag 'text': expected ..." in err otherwise. */
int dp_opts_parse_long(const char *flag, const char *text, long lo, long hi, long *out, char *err);
int dp_opts_parse_double(const char *flag, const char *text, double lo, double hi, double *out,
                         char *err);
int dp_opts_parse_u64(const char *flag, const char *text, uint64_t *out, char *err);
/* A crew: "N" (a fixed crew of N: *min 0, *max N) or "MIN:MAX" (elastic:
 * any of MAX task indexes may join, the run goes on with MIN live), with
 * 1 <= MIN <= MAX <= hi. */
int dp_opts_parse_crew(const char *flag, const char *text, int hi, int *min, int *max, char *err);
/* The text dp_opts_parse_crew reads back: "MAX" (min 0: a fixed crew) or "MIN:MAX". */
void dp_opts_crew_name(int min, int max, char *out, size_t n);
/* Environment variables (the table in ARCHITECTURE.md, "Environment"),
 * read by each program's main before it does anything, through the same
 * parsers: the variable's name stands where a flag's would ("DP_LOG 'x':
 * expected one of info|debug"), and the program exits 2 on it as on a bad
 * flag. Unset or empty: 0, *out untouched (the default stands). */
int dp_opts_env_long(const char *name, long lo, long hi, long *out, char *err);
int dp_opts_env_double(const char *name, double lo, double hi, double *out, char *err);
/* One of "a|b|c": *out its index. */
int dp_opts_env_choice(const char *name, const char *choices, int *out, char *err);
/* DP_LOG=info|debug: debug lines on or off (common/util.h). */
int dp_log_env(char *err);
/* n integers in [lo, hi] separated by sep ("I/K" with '/', "CxHxW" with 'x');
 * what names the shape in the message ("I/K, e.g. 0/2"). */
int dp_opts_parse_tuple(const char *flag, const char *text, char sep, int n, long lo, long hi,
                        const char *what, long *out, char *err);

#endif

/* downpour: the launcher, one binary for every command a user runs on one
 * machine:
 *   local        a whole cluster (ps shards + workers) here
 *   launch       the shards and N copies of any command as the workers
 *   scale        a running `downpour local`'s live worker count (elastic)
 *   eval         a checkpoint's test accuracy
 *   keygen       a CURVE key pair
 *   bench wire   the wire against plain ZeroMQ, shared memory against memcpy
 *   bench scale  pushes/s the servers sustain as workers and shards grow
 *   bench rows   rows pulled and pushed by key per second, against memcpy
 *   sim          virtual workers on a simulated clock (the lab)
 *   replay       a recorded schedule run again (the lab)
 *   sweep        a grid of runs and its report (the lab)
 *   gen-libsvm   sparse data of known truth, as libsvm text (the lab)
 * The daemons themselves are downpour-ps and downpour-worker (see
 * deploy/README.md for many machines).
 *
 * s_commands is the only list of them: the dispatch, the usage (--help,
 * from which help2man writes the man page) and the man page's one-line
 * summary (--summary, the Makefile's help2man -n) are all read from it, so
 * they cannot disagree. */
#include <stdio.h>
#include <string.h>

#include "common/opts.h"
#include "common/util.h"
#include "kernels/env.h"
#include "deploy/launcher/commands.h"

typedef struct {
    const char *name;     /* "local", or two words for a group: "bench wire" */
    int (*main)(int argc, char **argv); /* gets argv from the first word on */
    const char *synopsis; /* its flags in the usage; '\n' continues the line */
} s_command_t;

static const s_command_t s_commands[] = {
    {"local", dp_local_main,
     "--workers N|MIN:MAX [--ps-shards K] [--gpus 0,1] [--mode sync|async|ssp]\n"
     "[--chaos kill:SECONDS] [--out DIR] [any downpour-ps / downpour-worker flag]"},
    {"launch", dp_launch_main,
     "--workers N [--ps-shards K] [--init FILE | --model SPEC]\n"
     "[downpour-ps flags] -- COMMAND [ARGS...]"},
    {"scale", dp_scale_main, "DIR N"},
    {"eval", dp_eval_main, "--checkpoint FILE [--data SPEC] [--device DEV]"},
    {"keygen", dp_keygen_main, "FILE"},
    {"bench wire", dp_bench_wire_main, "[--bytes N | --model SPEC] [--shards K] [--json]"},
    {"bench rows", dp_bench_rows_main, "[--dim D] [--keys N] [--table R] [--shards K] [--json]"},
    {"bench scale", dp_bench_scale_main,
     "[--workers N] [--shards K] [--params P | --model SPEC] [--json]"},
    {"sim", dp_sim_main, "--workers M --compute DIST --updates N [--json]"},
    {"replay", dp_replay_main, "FILE --out DIR"},
    {"sweep", dp_sweep_main, "[--grid FILE] [--mode LIST] [--lr LIST] ... [--out DIR]"},
    {"gen-libsvm", dp_gen_libsvm_main,
     "--out-train FILE --out-test FILE [--samples N] [--keys K]\n"
     "[--nnz M] [--zipf S] [--seed N] [--truth FILE]"},
};
#define S_NCOMMANDS (sizeof s_commands / sizeof s_commands[0])

static void s_usage(FILE *f)
{
    for (size_t i = 0; i < S_NCOMMANDS; i++) {
        const s_command_t *c = &s_commands[i];
        /* A continuation line starts under the synopsis' first flag. */
        int indent = (int)strlen("usage: downpour  ") + (int)strlen(c->name);
        fprintf(f, "%s downpour %s ", i == 0 ? "usage:" : "      ", c->name);
        for (const char *p = c->synopsis; *p; p++) {
            if (*p == '\n')
                fprintf(f, "\n%*s", indent, "");
            else
                fputc(*p, f);
        }
        fputc('\n', f);
    }
    fprintf(f, "Run `downpour local --help` or `downpour eval --help` for details.\n");
}

/* The man page's NAME line: every command, in the table's order. */
static void s_summary(FILE *f)
{
    fprintf(f, "Downpour launcher:");
    for (size_t i = 0; i < S_NCOMMANDS; i++)
        fprintf(f, "%s %s", i ? "," : "", s_commands[i].name);
    fputc('\n', f);
}

/* Does argv name c? A group's second word must follow its first. */
static int s_matches(const s_command_t *c, int argc, char **argv)
{
    const char *space = strchr(c->name, ' ');
    if (!space) return strcmp(argv[1], c->name) == 0;
    size_t n = (size_t)(space - c->name);
    return strlen(argv[1]) == n && strncmp(argv[1], c->name, n) == 0 && argc > 2 &&
           strcmp(argv[2], space + 1) == 0;
}

/* argv[1] is a group's first word ("bench") without one of its second
 * words: one line naming those it has. */
static int s_group_refused(const char *word)
{
    char list[DP_ERR_LEN] = "";
    size_t n = strlen(word);
    for (size_t i = 0; i < S_NCOMMANDS; i++) {
        const char *name = s_commands[i].name;
        if (strncmp(name, word, n) != 0 || name[n] != ' ') continue;
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s`downpour %s`", len ? " or " : "", name);
    }
    if (!list[0]) return 0;
    fprintf(stderr, "downpour %s: expected %s (see downpour --help)\n", word, list);
    return 1;
}

int main(int argc, char **argv)
{
    dp_log_init("downpour");
    /* The environment's knobs first, refused as a bad flag is. */
    char err[DP_ERR_LEN];
    if (dp_log_env(err) != 0 || dp_kernels_env(err) != 0) {
        fprintf(stderr, "downpour: %s\n", err);
        return 2;
    }
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        s_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--summary") == 0) {
        s_summary(stdout);
        return 0;
    }
    for (size_t i = 0; i < S_NCOMMANDS; i++)
        if (s_matches(&s_commands[i], argc, argv)) return s_commands[i].main(argc - 1, argv + 1);
    if (s_group_refused(argv[1])) return 2;
    /* The first words, a group once ("bench"), the last after "or". */
    const char *first[S_NCOMMANDS];
    int len[S_NCOMMANDS], n = 0;
    for (size_t i = 0; i < S_NCOMMANDS; i++) {
        int w = (int)strcspn(s_commands[i].name, " ");
        if (n > 0 && len[n - 1] == w && strncmp(first[n - 1], s_commands[i].name, (size_t)w) == 0)
            continue;
        first[n] = s_commands[i].name, len[n++] = w;
    }
    char names[DP_ERR_LEN] = "";
    for (int i = 0; i < n; i++) {
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%.*s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
                 len[i], first[i]);
    }
    fprintf(stderr, "downpour: unknown command '%s' (%s; see downpour --help)\n", argv[1], names);
    return 2;
}

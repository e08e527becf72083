/* opts: the option-table driver over getopt_long, the number parsers every
 * flag goes through, and --help from the table (see opts.h).
 *
 * getopt_long is restarted for every parse (optind = 0), so a process may
 * parse several command lines (the launcher checks the daemons' flags; the
 * tests parse many); opterr = 0 because every message is ours, one line. */
#include "common/opts.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* getopt_long's val for entry i: above every short option character. */
#define S_VAL_BASE 256

void dp_opts_init(dp_opts_t *o, const char *program, const char *synopsis, const char *epilog)
{
    memset(o, 0, sizeof *o);
    o->program = program;
    o->synopsis = synopsis;
    o->epilog = epilog;
}

void dp_opts_add(dp_opts_t *o, const dp_opts_flag_t *entries, int n)
{
    if (o->n + n > DP_OPTS_MAX) {
        fprintf(stderr, "%s: more than %d flags in the option table\n", o->program, DP_OPTS_MAX);
        abort();
    }
    memcpy(o->opt + o->n, entries, (size_t)n * sizeof *entries);
    o->n += n;
}

void dp_opts_add_at(dp_opts_t *o, void *base, const dp_opts_entry_t *entries, int n)
{
    for (int i = 0; i < n; i++) {
        dp_opts_flag_t f = entries[i].flag;
        void *p = (char *)base + entries[i].at;
        if (f.kind == DP_OPTS_CALL) f.arg = p;
        else if (f.kind != DP_OPTS_HEADING) f.target = p;
        dp_opts_add(o, &f, 1);
    }
}

dp_opts_flag_t *dp_opts_find(dp_opts_t *o, const char *name)
{
    for (int i = 0; i < o->n; i++)
        if (o->opt[i].kind != DP_OPTS_HEADING && strcmp(o->opt[i].name, name) == 0)
            return &o->opt[i];
    return NULL;
}

/* Whole-text decimal checks shared by the parsers: strto* skip leading
 * blanks and take a sign, which a flag value must not rely on. */
static int s_plain(const char *text, int allow_minus)
{
    if (!text[0] || text[0] == ' ' || text[0] == '\t' || text[0] == '+') return 0;
    return allow_minus || text[0] != '-';
}

int dp_opts_parse_long(const char *flag, const char *text, long lo, long hi, long *out, char *err)
{
    char *end = NULL;
    errno = 0;
    long x = s_plain(text, 1) ? strtol(text, &end, 10) : 0;
    if (!end || end == text || *end || errno || x < lo || x > hi)
        return dp_err(err, "%s '%s': expected an integer in [%ld, %ld]", flag, text, lo, hi);
    *out = x;
    return 0;
}

int dp_opts_parse_double(const char *flag, const char *text, double lo, double hi, double *out,
                         char *err)
{
    char *end = NULL;
    errno = 0;
    /* Decimal only: strtod would also read hex floats ("0x1p3"). */
    double x = s_plain(text, 1) && !strpbrk(text, "xX") ? strtod(text, &end) : 0;
    /* !(in range) also refuses nan. */
    if (!end || end == text || *end || errno || !(x >= lo && x <= hi))
        return dp_err(err, "%s '%s': expected a number in [%g, %g]", flag, text, lo, hi);
    *out = x;
    return 0;
}

int dp_opts_parse_crew(const char *flag, const char *text, int hi, int *min, int *max, char *err)
{
    const char *colon = strchr(text, ':');
    long lo_v = 0, hi_v = 0;
    if (!colon) {
        if (dp_opts_parse_long(flag, text, 1, hi, &hi_v, err) != 0) return -1;
        *min = 0;
        *max = (int)hi_v;
        return 0;
    }
    char head[32] = "";
    size_t n = (size_t)(colon - text);
    if (n < sizeof head) memcpy(head, text, n);
    if (n >= sizeof head || dp_opts_parse_long(flag, head, 1, hi, &lo_v, NULL) != 0 ||
        dp_opts_parse_long(flag, colon + 1, 1, hi, &hi_v, NULL) != 0)
        return dp_err(err, "%s '%s': expected N or MIN:MAX (integers in [1, %d])", flag, text, hi);
    if (lo_v > hi_v)
        return dp_err(err, "%s '%s': MIN %ld is above MAX %ld", flag, text, lo_v, hi_v);
    *min = (int)lo_v;
    *max = (int)hi_v;
    return 0;
}

void dp_opts_crew_name(int min, int max, char *out, size_t n)
{
    if (min > 0) snprintf(out, n, "%d:%d", min, max);
    else snprintf(out, n, "%d", max);
}

int dp_opts_parse_u64(const char *flag, const char *text, uint64_t *out, char *err)
{
    char *end = NULL;
    errno = 0;
    /* strtoull would turn "-1" into 2^64 - 1: no sign at all. */
    unsigned long long x = s_plain(text, 0) ? strtoull(text, &end, 10) : 0;
    if (!end || end == text || *end || errno)
        return dp_err(err, "%s '%s': expected an integer in [0, %" PRIu64 "]", flag, text,
                      UINT64_MAX);
    *out = (uint64_t)x;
    return 0;
}

int dp_opts_parse_tuple(const char *flag, const char *text, char sep, int n, long lo, long hi,
                        const char *what, long *out, char *err)
{
    const char *p = text;
    for (int i = 0; i < n; i++) {
        const char *stop = i + 1 < n ? strchr(p, sep) : p + strlen(p);
        char part[32];
        if (!stop || stop - p >= (long)sizeof part) goto bad;
        snprintf(part, sizeof part, "%.*s", (int)(stop - p), p);
        if (dp_opts_parse_long(flag, part, lo, hi, &out[i], NULL) != 0) goto bad;
        p = stop + 1;
    }
    return 0;
bad:
    return dp_err(err, "%s '%s': expected %s", flag, text, what);
}

/* CHOICE: the index of v in "a|b|c", or -1. */
static int s_choice(const char *choices, const char *v)
{
    size_t len = strlen(v);
    int i = 0;
    for (const char *p = choices;; i++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, v, n) == 0) return i;
        if (!bar) return -1;
        p = bar + 1;
    }
}

/* The numeric kinds: parse, check the range, store. */
int dp_opts_env_long(const char *name, long lo, long hi, long *out, char *err)
{
    const char *v = getenv(name);
    return v && *v ? dp_opts_parse_long(name, v, lo, hi, out, err) : 0;
}

int dp_opts_env_double(const char *name, double lo, double hi, double *out, char *err)
{
    const char *v = getenv(name);
    return v && *v ? dp_opts_parse_double(name, v, lo, hi, out, err) : 0;
}

int dp_opts_env_choice(const char *name, const char *choices, int *out, char *err)
{
    const char *v = getenv(name);
    if (!v || !*v) return 0;
    int k = s_choice(choices, v);
    if (k < 0) return dp_err(err, "%s '%s': expected one of %s", name, v, choices);
    *out = k;
    return 0;
}

int dp_log_env(char *err)
{
    int level = 0;
    if (dp_opts_env_choice("DP_LOG", "info|debug", &level, err) != 0) return -1;
    dp_log_set_debug(level == 1);
    return 0;
}

static int s_apply_number(dp_opts_flag_t *e, const char *flag, const char *v, char *err)
{
    long l;
    double d;
    switch (e->kind) {
    case DP_OPTS_INT:
    case DP_OPTS_LONG:
        if (dp_opts_parse_long(flag, v, (long)e->lo, (long)e->hi, &l, err) != 0) return -1;
        if (e->kind == DP_OPTS_INT) *(int *)e->target = (int)l;
        else *(long *)e->target = l;
        return 0;
    case DP_OPTS_DOUBLE:
    case DP_OPTS_FLOAT:
        if (dp_opts_parse_double(flag, v, e->lo, e->hi, &d, err) != 0) return -1;
        if (e->kind == DP_OPTS_DOUBLE) *(double *)e->target = d;
        else *(float *)e->target = (float)d;
        return 0;
    default:
        return dp_opts_parse_u64(flag, v, (uint64_t *)e->target, err);
    }
}

/* One occurrence of entry e with value v (NULL for a FLAG). */
static int s_apply(dp_opts_flag_t *e, const char *v, char *err)
{
    char flag[80];
    snprintf(flag, sizeof flag, "--%s", e->name);
    int k;
    switch (e->kind) {
    case DP_OPTS_FLAG: *(int *)e->target = e->value; break;
    case DP_OPTS_STR: *(const char **)e->target = v; break;
    case DP_OPTS_BUF:
        if (strlen(v) >= e->size)
            return dp_err(err, "%s '%.40s...': longer than %zu characters", flag, v, e->size - 1);
        memcpy(e->target, v, strlen(v) + 1);
        break;
    case DP_OPTS_CHOICE:
        if ((k = s_choice(e->choices, v)) < 0)
            return dp_err(err, "%s '%s': expected one of %s", flag, v, e->choices);
        *(int *)e->target = k;
        break;
    case DP_OPTS_CALL: {
        /* The parser's reason, prefixed with the flag that was given. */
        char why[DP_ERR_LEN] = "";
        if (e->set(e->arg, v, why) != 0) return dp_err(err, "%s: %s", flag, why);
        break;
    }
    default:
        if (s_apply_number(e, flag, v, err) != 0) return -1;
    }
    e->given = v ? v : "";
    return 0;
}

/* getopt_long's table from ours: entry i answers S_VAL_BASE + i. */
static void s_long_options(const dp_opts_t *o, struct option *lo)
{
    int n = 0;
    for (int i = 0; i < o->n; i++) {
        if (o->opt[i].kind == DP_OPTS_HEADING) continue;
        lo[n++] = (struct option){o->opt[i].name,
                                  o->opt[i].kind == DP_OPTS_FLAG ? no_argument : required_argument,
                                  NULL, S_VAL_BASE + i};
    }
    lo[n++] = (struct option){"help", no_argument, NULL, 'h'};
    lo[n] = (struct option){NULL, 0, NULL, 0};
}

/* getopt_long's '?' and ':' into one line naming the flag. */
static int s_refuse(const dp_opts_t *o, int c, char **argv, char *err)
{
    const char *arg = argv[optind - 1];
    int eq = (int)strcspn(arg, "=");
    if (optopt >= S_VAL_BASE && c == ':')
        return dp_err(err, "--%s needs a value (see %s --help)", o->opt[optopt - S_VAL_BASE].name,
                      o->program);
    if (optopt >= S_VAL_BASE)
        return dp_err(err, "--%s takes no value (see %s --help)", o->opt[optopt - S_VAL_BASE].name,
                      o->program);
    if (optopt > 0) return dp_err(err, "unknown flag '-%c' (see %s --help)", optopt, o->program);
    return dp_err(err, "unknown flag '%.*s' (see %s --help)", eq, arg, o->program);
}

/* getopt_long takes a unique prefix of a long flag ("--epoch" for
 * --epochs): a flag must be given whole, so the text getopt matched is
 * checked against the entry's name. The flag's text is the word before
 * optind, or the one before that when its value came as the next word. */
static int s_whole(const struct option *lo, int li, char **argv, const char *program, char *err)
{
    if (li < 0) return 0; /* -h */
    const char *word = argv[optind - 1];
    if (optarg && optarg == word && optind >= 2) word = argv[optind - 2];
    if (strncmp(word, "--", 2) != 0) return 0;
    size_t len = strcspn(word + 2, "=");
    if (len == strlen(lo[li].name) && strncmp(word + 2, lo[li].name, len) == 0) return 0;
    return dp_err(err, "unknown flag '%.*s' (did you mean --%s? see %s --help)", (int)len + 2, word,
                  lo[li].name, program);
}

dp_opts_result_t dp_opts_parse(dp_opts_t *o, int argc, char **argv, char *err)
{
    struct option lo[DP_OPTS_MAX + 2];
    s_long_options(o, lo);
    for (int i = 0; i < o->n; i++) o->opt[i].given = NULL;
    optind = 0;
    opterr = 0;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":h", lo, &li)) != -1) {
        if (c != '?' && c != ':' && s_whole(lo, li, argv, o->program, err) != 0) return DP_OPTS_BAD;
        li = -1;
        if (c == 'h') {
            dp_opts_help(o, stdout);
            return DP_OPTS_HELP_SHOWN;
        }
        if (c == '?' || c == ':') {
            s_refuse(o, c, argv, err);
            return DP_OPTS_BAD;
        }
        if (s_apply(&o->opt[c - S_VAL_BASE], optarg, err) != 0) return DP_OPTS_BAD;
    }
    if (optind < argc) {
        dp_err(err, "unexpected argument '%s' (see %s --help)", argv[optind], o->program);
        return DP_OPTS_BAD;
    }
    return DP_OPTS_PARSED;
}

int dp_opts_exit_status(const char *program, dp_opts_result_t rc, const char *err)
{
    if (rc == DP_OPTS_HELP_SHOWN) return 0;
    fprintf(stderr, "%s: %s\n", program, err);
    return 2;
}

/* One help line: "  --name META" in a 30-column field, then the help; its
 * further lines ("\n") line up under the first. */
static void s_help_line(FILE *f, const char *name, const char *meta, const char *help)
{
    char left[160];
    snprintf(left, sizeof left, "  --%s%s%s", name, meta ? " " : "", meta ? meta : "");
    if (strlen(left) > 30) fprintf(f, "%s\n%31s", left, "");
    else fprintf(f, "%-31s", left);
    for (const char *p = help; *p; p++) {
        fputc(*p, f);
        if (*p == '\n') fprintf(f, "%31s", "");
    }
    fputc('\n', f);
}

void dp_opts_help(const dp_opts_t *o, FILE *f)
{
    if (o->synopsis) fputs(o->synopsis, f);
    for (int i = 0; i < o->n; i++) {
        const dp_opts_flag_t *e = &o->opt[i];
        if (e->kind == DP_OPTS_HEADING) fprintf(f, "%s\n", e->help);
        else s_help_line(f, e->name, e->kind == DP_OPTS_FLAG ? NULL : e->meta, e->help);
    }
    s_help_line(f, "help", NULL, "this text (also -h)");
    if (o->epilog) fputs(o->epilog, f);
}

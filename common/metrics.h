/* metrics: the daemons' metrics as JSON-lines files, and the end-of-run
 * summary as one JSON file.
 *
 * A metrics file holds one JSON object per line, each starting with "t", the
 * wall-clock Unix time in seconds (so lines of all processes line up):
 *   {"t":1795964412.345,"step":200,"loss":0.412345}
 * Lines are buffered and written whole by a flusher thread at least once a
 * second, and at dp_metrics_flush / dp_metrics_destroy: a crash loses at most
 * about one second of lines, and a clean exit never leaves a half line.
 * Every line is valid JSON: non-finite numbers formatted by the caller ("nan",
 * "-inf") are written as null, and a body that still does not parse is
 * written as a string under "invalid" (and warned about once) rather than
 * breaking the file. Calls are thread-safe; lines never interleave.
 *
 *   dp_metrics_t *m;
 *   if (dp_metrics_new(&m, flag_metrics, err) != 0) ...;   // NULL / "" -> off
 *   dp_metrics_write(m, "\"step\":%ld,\"loss\":%.6f", step, loss);
 *   dp_metrics_destroy(&m);
 */
#ifndef DP_METRICS_H
#define DP_METRICS_H

#include <cjson/cJSON.h>

typedef struct dp_metrics dp_metrics_t;

/* Create (truncate) path. path NULL or "" gives a disabled writer whose calls
 * do nothing. Parent directories are not created: a missing one is an error
 * naming the path. */
int dp_metrics_new(dp_metrics_t **out, const char *path, char *err);

/* Append one line: {"t":<unix time>,<body>} where body is printf-formatted from
 * fmt, e.g. "\"step\":%ld,\"loss\":%.6f". An empty body gives {"t":...}.
 * m may be NULL or disabled (no-op). */
void dp_metrics_write(dp_metrics_t *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Write out what is buffered now. */
void dp_metrics_flush(dp_metrics_t *m);

/* Flush, close, free, set *m_p to NULL; safe twice and on NULL. */
void dp_metrics_destroy(dp_metrics_t **m_p);

/* Seconds since open, as "t" would say now (0 for a disabled writer). */
double dp_metrics_elapsed(const dp_metrics_t *m);

/* A copy of the JSON text s (caller frees) in which every bare nan / inf /
 * infinity token (any case, optional sign) in a value position outside
 * strings, as printf writes non-finite doubles, is replaced by null. Exposed
 * for the tests and for callers that build JSON by hand. */
char *dp_json_nonfinite_to_null(const char *s);

/* The summary file: obj printed (formatted, trailing newline) and written
 * atomically with dp_write_file_atomic, so readers never see half a file.
 * cJSON prints NaN / Inf numbers as null. */
int dp_summary_write(const char *path, const cJSON *obj, char *err);

#endif

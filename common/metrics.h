/* metrics: the daemons' metrics as JSON-lines files, and the end-of-run
 * summary as one JSON file. Both are cJSON objects printed by cJSON.
 *
 * A metrics file holds one JSON object per line, each starting with "t", the
 * wall-clock Unix time in seconds to the millisecond (so lines of all
 * processes line up):
 *   {"t":1795964412.345,"step":200,"loss":0.412345}
 * Lines are buffered and written whole by a flusher thread at least once a
 * second, and at dp_metrics_flush / dp_metrics_destroy: a crash loses at most
 * about one second of lines, and a clean exit never leaves a half line.
 * Non-finite numbers are written as null (cJSON prints them so). Calls are
 * thread-safe; lines never interleave.
 *
 *   dp_metrics_t *m;
 *   if (dp_metrics_new(&m, flag_metrics, err) != 0) ...;   // NULL / "" -> off
 *   cJSON *line = dp_metrics_line(m);                      // NULL when off
 *   if (line) {
 *       cJSON_AddNumberToObject(line, "step", step);
 *       cJSON_AddNumberToObject(line, "loss", dp_metrics_round(loss, 6));
 *       dp_metrics_write(m, &line);
 *   }
 *   dp_metrics_destroy(&m);
 */
#ifndef DP_METRICS_H
#define DP_METRICS_H

#include <cjson/cJSON.h>

typedef struct dp_metrics dp_metrics_t;

/* Open path for appending (created if absent): a restarted process, or a
 * second run given the same file, adds its lines after the earlier ones
 * (`downpour local` removes its own files first). path NULL or "" gives a
 * disabled writer whose calls do nothing. Parent directories are not created: a missing one is an error
 * naming the path. */
int dp_metrics_new(dp_metrics_t **out, const char *path, char *err);

/* A new line: an object holding "t" (now), for the caller to add its fields
 * to and pass to dp_metrics_write. NULL when m is NULL or disabled, so a
 * caller builds nothing for a writer that writes nothing. */
cJSON *dp_metrics_line(const dp_metrics_t *m);

/* Append *line_p as one line, free it and set *line_p to NULL. A NULL line,
 * or m NULL or disabled, writes nothing (the line is freed all the same). */
void dp_metrics_write(dp_metrics_t *m, cJSON **line_p);

/* v rounded to the given number of significant digits, as printf's "%.*g"
 * would print it (NaN and Inf stay so): a metric that means no more than that
 * prints short, e.g. a float loss as 0.412345 rather than
 * 0.41234511137008667. */
double dp_metrics_round(double v, int digits);

/* Write out what is buffered now. */
void dp_metrics_flush(dp_metrics_t *m);

/* Flush, close, free, set *m_p to NULL; safe twice and on NULL. */
void dp_metrics_destroy(dp_metrics_t **m_p);

/* The last record of a metrics file: its last line that parses and is
 * not an event (an "event" field: a start, a join or leave, an eval),
 * which a reader after the run's state (a progress line) must pass over.
 * NULL when there is none, or no file; the caller frees it. */
cJSON *dp_metrics_last(const char *path);

/* The summary file: obj printed (formatted, trailing newline) and written
 * atomically with dp_write_file_atomic, so readers never see half a file.
 * cJSON prints NaN / Inf numbers as null. */
int dp_summary_write(const char *path, const cJSON *obj, char *err);

#endif

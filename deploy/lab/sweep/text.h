/* sweep/text: a growing text buffer for the report's files (written whole,
 * atomically, once complete: never a half-written report). */
#ifndef DP_SWEEP_TEXT_H
#define DP_SWEEP_TEXT_H

#include <stddef.h>

typedef struct {
    char *s;     /* NUL-terminated; NULL while empty */
    size_t len, cap;
} dp_sweep_text_t;

void dp_sweep_text_add(dp_sweep_text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Writes dir/name atomically; frees the text either way. */
int dp_sweep_text_save(dp_sweep_text_t *t, const char *dir, const char *name, char *err);

#endif

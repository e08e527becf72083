/* staleness: a staleness histogram and its geometric fit (see staleness.h). */
#include "common/staleness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void dp_staleness_init(dp_staleness_t *h)
{
    memset(h, 0, sizeof *h);
}

void dp_staleness_fini(dp_staleness_t *h)
{
    free(h->count);
    memset(h, 0, sizeof *h);
}

/* Room for bin b (b < cap), doubling so adds stay amortised O(1). */
static void s_reserve(dp_staleness_t *h, size_t b)
{
    if (b < h->bins) return;
    size_t n = h->bins ? h->bins : 16;
    while (n <= b) n *= 2;
    if (n > DP_STALENESS_CAP) n = DP_STALENESS_CAP;
    h->count = dp_realloc(h->count, n * sizeof *h->count);
    memset(h->count + h->bins, 0, (n - h->bins) * sizeof *h->count);
    h->bins = n;
}

static void s_add_n(dp_staleness_t *h, size_t bin, uint64_t n)
{
    s_reserve(h, bin);
    h->count[bin] += n;
}

void dp_staleness_add_n(dp_staleness_t *h, uint64_t value, uint64_t n)
{
    if (n == 0) return;
    size_t bin = value < DP_STALENESS_CAP - 1 ? (size_t)value : DP_STALENESS_CAP - 1;
    s_add_n(h, bin, n);
    h->total += n;
    h->sum += value * n;
    if (value > h->max) h->max = value;
}

void dp_staleness_add(dp_staleness_t *h, uint64_t value)
{
    dp_staleness_add_n(h, value, 1);
}

void dp_staleness_merge(dp_staleness_t *dst, const dp_staleness_t *src)
{
    for (size_t b = 0; b < src->bins; b++)
        if (src->count[b]) s_add_n(dst, b, src->count[b]);
    dst->total += src->total;
    dst->sum += src->sum;
    if (src->max > dst->max) dst->max = src->max;
}

double dp_staleness_mean(const dp_staleness_t *h)
{
    return h->total ? (double)h->sum / (double)h->total : 0.0;
}

double dp_staleness_fresh(const dp_staleness_t *h)
{
    return h->total && h->bins ? (double)h->count[0] / (double)h->total : 0.0;
}

double dp_staleness_geometric_p(const dp_staleness_t *h)
{
    return 1.0 / (1.0 + dp_staleness_mean(h));
}

size_t dp_staleness_fold(const dp_staleness_t *h, uint64_t *out, size_t n)
{
    size_t used = 0;
    for (size_t b = 0; b < h->bins && n > 0; b++) {
        if (!h->count[b]) continue;
        size_t to = b < n - 1 ? b : n - 1;
        if (to >= used) {
            memset(out + used, 0, (to + 1 - used) * sizeof *out);
            used = to + 1;
        }
        out[to] += h->count[b];
    }
    return used;
}

cJSON *dp_staleness_json(const dp_staleness_t *h)
{
    size_t used = h->bins;
    while (used > 0 && h->count[used - 1] == 0) used--;
    cJSON *a = cJSON_CreateArray();
    for (size_t b = 0; b < used; b++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)h->count[b]));
    return a;
}

int dp_staleness_from_json(dp_staleness_t *h, const cJSON *arr, char *err)
{
    dp_staleness_init(h);
    if (!cJSON_IsArray(arr)) return dp_err(err, "staleness histogram: not a JSON array");
    size_t v = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        double c = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (c < 0 || c != floor(c) || c > 9e15 || v >= DP_STALENESS_CAP) {
            dp_staleness_fini(h);
            return dp_err(err, "staleness histogram: bin %zu is not a count", v);
        }
        if (c > 0) {
            s_add_n(h, v, (uint64_t)c);
            h->total += (uint64_t)c;
            h->sum += (uint64_t)c * v;
            h->max = v;
        }
        v++;
    }
    return 0;
}

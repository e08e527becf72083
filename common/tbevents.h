/* tbevents: TensorBoard event files, no TensorFlow needed.
 *
 * A file LOGDIR/events.out.tfevents.<unix time>.<hostname>[.<suffix>] is a
 * sequence of TFRecords:
 *   uint64 length (LE) | uint32 masked crc32c(length bytes) | data |
 *   uint32 masked crc32c(data)
 * with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8, and each data an
 * Event packed by protoc-c from common/tb_event.proto (TensorFlow's Event and
 * Summary, the scalar fields only): the first record's Event holds
 * file_version "brain.Event:2", the others one Summary.Value with a tag and a
 * simple_value. `tensorboard --logdir LOGDIR` shows the scalars.
 *
 * Each record goes out with one write(2) as it is made: records are few and
 * small (a handful of scalars per logging step) and TensorBoard reads the
 * file while it grows. Calls are thread-safe. */
#ifndef DP_TBEVENTS_H
#define DP_TBEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct dp_tb dp_tb_t;

/* Create LOGDIR (and its parents, as TensorFlow does) and a new event file in
 * it, starting with the file_version event. suffix may be NULL or "" (no
 * trailing ".<suffix>") and must not contain '/'. logdir NULL or "" gives a
 * disabled writer whose calls do nothing. If the name is taken (two writers
 * in one second), ".<pid>" is appended. */
int dp_tb_new(dp_tb_t **out, const char *logdir, const char *suffix, char *err);

/* One scalar point: the tag's value at a step. A write error is warned about
 * once and training goes on. tb may be NULL or disabled (no-op). */
void dp_tb_scalar(dp_tb_t *tb, const char *tag, long step, float value);

/* Close, free, set *tb_p to NULL; safe twice and on NULL. */
void dp_tb_destroy(dp_tb_t **tb_p);

/* The TFRecord mask of a record's CRC-32C (dp_crc32c, common/checksum.h). */
uint32_t dp_crc32c_mask(uint32_t crc);

#endif

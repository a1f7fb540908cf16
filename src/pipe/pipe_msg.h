/* Internal to src/pipe: the messages that circulate on a pipeline's ring
 * (docs/pipeline.md, "Messages").
 *
 * A message is a 64-byte little-endian header and a payload:
 *   n_seq x (i32 slot, u32 ntok), then
 *   STEP:   rows x i32 token ids            (driver -> stage 0)
 *   HIDDEN: rows x hidden f32 values        (stage i -> stage i+1)
 *   ERROR:  text (printable ASCII)          (passed on to the driver)
 *   END:    nothing                         (around the ring once)
 * rows = sum of ntok. Every field is checked by ft_pipe_msg_parse against
 * the receiving stage's limits (fuzzed: fuzz/fuzz_pipe_msg.c). */
#ifndef FT_PIPE_MSG_H
#define FT_PIPE_MSG_H
#include "flextier/core.h"

#define FT_PIPE_MAGIC   0x50505446u   /* "FTPP" */
#define FT_PIPE_VERSION 1u
#define FT_PIPE_HDR     64u
#define FT_PIPE_ERR_MAX 256u

enum { FT_PM_STEP = 1, FT_PM_HIDDEN = 2, FT_PM_ERROR = 3, FT_PM_END = 4 };
#define FT_PM_RESET 1u   /* flags: the slots start new sequences */

/* What a stage accepts. */
typedef struct ft_pipe_limits {
    uint32_t max_batch, max_rows, hidden, vocab;
} ft_pipe_limits;

/* A parsed message: pointers into the buffer it was parsed from. */
typedef struct ft_pipe_msg {
    uint16_t type;
    uint32_t mb, n_seq, rows, flags;
    uint64_t job, seq;          /* the run; the message's number (checks) */
    const uint8_t *seqs;        /* n_seq x (i32 slot, u32 ntok)          */
    const uint8_t *data;        /* tokens / hidden / error text          */
    size_t data_len;
} ft_pipe_msg;

/* Bytes of a message. */
size_t ft_pipe_msg_size(uint16_t type, uint32_t n_seq, uint32_t rows, uint32_t hidden, size_t text_len);
/* Write the header and the per-sequence table; the caller fills the data
 * at buf + returned offset. slots/ntok may be NULL when n_seq == 0. */
size_t ft_pipe_msg_begin(uint8_t *buf, uint16_t type, uint64_t job, uint64_t seq, uint32_t mb, uint32_t flags,
                         uint32_t n_seq, const int *slots, const size_t *ntok, uint32_t rows, size_t data_len);
/* An ERROR message with text (truncated to FT_PIPE_ERR_MAX). */
size_t ft_pipe_msg_error(uint8_t *buf, size_t cap, uint64_t job, const char *text);
/* Parse and check a whole message of len bytes. FT_ERR_PROTOCOL with a
 * detail naming the field. */
ft_status ft_pipe_msg_parse(const void *buf, size_t len, const ft_pipe_limits *lim, ft_pipe_msg *out);
/* Sequence i of a parsed message. */
void ft_pipe_msg_seq(const ft_pipe_msg *m, uint32_t i, int *slot, size_t *ntok);
#endif

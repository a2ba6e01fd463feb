/*
 * nsa_decode_record.h -- the record of a decode step's device checks
 * (docs/nsa-semantics.md section 10), shared by the CUDA and HIP backends so
 * that both check the same way and word the same messages (the cpu
 * reference's):
 *   - the record's layout (int32 fields) and the reasons a check fails;
 *   - nsa_dec_len_reason, the length checks of one sequence, in the cpu
 *     reference's order (device and host);
 *   - nsa_dec_record_message, the named status and message of a record, for
 *     the backend's decode_status (host).
 * Plain C: no vendor header (NSA_HD from nsa_blocks.h makes the length check
 * callable from CUDA and HIP device code; device code includes the vendor's
 * runtime header first, as for nsa_blocks.h).
 */
#ifndef NSA_KERNELS_COMMON_NSA_DECODE_RECORD_H
#define NSA_KERNELS_COMMON_NSA_DECODE_RECORD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nsa.h"
#include "nsa_blocks.h"

/* The record's fields (int32 each). */
enum {
    NSA_DR_STATUS = 0, /* nsa_status of the step's checks, 0: passed */
    NSA_DR_SEQ,        /* the first bad sequence, or -1 */
    NSA_DR_REASON,     /* NSA_DRS_* */
    NSA_DR_COL,        /* the table column of a bad entry */
    NSA_DR_ENTRY,      /* its value */
    NSA_DR_COUNT,      /* how often a written page appears */
    NSA_DR_CU0,        /* cu_seqlens_q[seq], cu_seqlens_q[seq + 1], cache_seqlens[seq] as read */
    NSA_DR_CU1,
    NSA_DR_TK0,
    NSA_DR_FIELDS = 16
};

/* Why a step failed its checks. */
enum {
    NSA_DRS_OK = 0,
    NSA_DRS_CU0,        /* cu_seqlens_q[0] != 0 */
    NSA_DRS_DECREASES,  /* TQ < 0 */
    NSA_DRS_TOTAL,      /* cu_seqlens_q[b + 1] > max_total_tokens */
    NSA_DRS_STEP,       /* TQ > max_step_tokens */
    NSA_DRS_TK0,        /* TK0 < 0 */
    NSA_DRS_CONTEXT,    /* TK > max_context */
    NSA_DRS_PAGES,      /* TK > max_pages * page_size */
    NSA_DRS_CMP_PAGES,  /* Nc(TK) > max_cmp_pages * cmp_page_size */
    NSA_DRS_ENTRY,      /* block_table entry outside [0, num_pages) */
    NSA_DRS_CMP_ENTRY,  /* cmp_block_table entry outside [0, num_cmp_pages) */
    NSA_DRS_SHARED,     /* a written page appears more than once */
    NSA_DRS_CMP_SHARED  /* a written compressed page appears more than once */
};

/* The length checks of sequence b (c0 = cu_seqlens_q[b], c1 = cu_seqlens_q[b + 1],
 * tk0 = cache_seqlens[b]) against the plan's limits and the compression block
 * (l, d): the first that fails, or NSA_DRS_OK. */
NSA_HD int nsa_dec_len_reason(int64_t b, int64_t c0, int64_t c1, int64_t tk0, int64_t max_total, int64_t max_step,
                              int64_t max_context, int64_t max_pages, int64_t ps, int64_t max_cmp_pages, int64_t cps,
                              int64_t l, int64_t d)
{
    const int64_t tq = c1 - c0, tk = tk0 + tq;
    if (b == 0 && c0 != 0) return NSA_DRS_CU0;
    if (tq < 0) return NSA_DRS_DECREASES;
    if (c1 > max_total) return NSA_DRS_TOTAL;
    if (tq > max_step) return NSA_DRS_STEP;
    if (tk0 < 0) return NSA_DRS_TK0;
    if (tk > max_context) return NSA_DRS_CONTEXT;
    if (tq > 0 && tk > max_pages * ps) return NSA_DRS_PAGES;
    if (tq > 0 && nsa_num_cmp_blocks(tk, l, d) > max_cmp_pages * cps) return NSA_DRS_CMP_PAGES;
    return NSA_DRS_OK;
}

/* The status of a record r (NSA_DR_FIELDS int32) of a plan with limits L, and
 * its message into msg (as the cpu backend words it); NSA_SUCCESS and an empty
 * message when the step passed. The backend passes both to its set_error. */
static inline nsa_status nsa_dec_record_message(const int32_t *r, const nsa_decode_limits *L, char *msg, size_t size)
{
    if (size) msg[0] = '\0';
    if (r[NSA_DR_STATUS] == NSA_SUCCESS) return NSA_SUCCESS;
    const nsa_status s = (nsa_status)r[NSA_DR_STATUS];
    const long long b = r[NSA_DR_SEQ], x = r[NSA_DR_COL], ps = L->page_size, cps = L->cmp_page_size;
    const long long tq = (long long)r[NSA_DR_CU1] - r[NSA_DR_CU0], tk0 = r[NSA_DR_TK0], tk = tk0 + tq;
    const char *why = NULL;
    switch (r[NSA_DR_REASON]) {
    case NSA_DRS_CU0:
        snprintf(msg, size, "nsa_decode: cu_seqlens_q[0] = %d, but it must be 0", (int)r[NSA_DR_CU0]);
        return s;
    case NSA_DRS_DECREASES: why = "cu_seqlens_q decreases"; break;
    case NSA_DRS_TOTAL: why = "cu_seqlens_q passes the plan's max_total_tokens"; break;
    case NSA_DRS_STEP: why = "its TQ exceeds the plan's max_step_tokens"; break;
    case NSA_DRS_TK0: why = "cache_seqlens (TK0) is negative"; break;
    case NSA_DRS_CONTEXT: why = "TK = TK0 + TQ exceeds the plan's max_context"; break;
    case NSA_DRS_PAGES: why = "TK = TK0 + TQ does not fit its max_pages pages of page_size positions"; break;
    case NSA_DRS_CMP_PAGES: why = "its Nc(TK) compressed rows do not fit max_cmp_pages pages of cmp_page_size rows"; break;
    case NSA_DRS_ENTRY:
    case NSA_DRS_CMP_ENTRY: {
        const int c = r[NSA_DR_REASON] == NSA_DRS_CMP_ENTRY;
        const long long per = c ? cps : ps;
        snprintf(msg, size,
                 "nsa_decode: %s[%lld][%lld] = %d is outside [0, %s = %lld) (sequence %lld reads or writes %s %lld "
                 ".. %lld there)",
                 c ? "cmp_block_table" : "block_table", b, x, (int)r[NSA_DR_ENTRY], c ? "num_cmp_pages" : "num_pages",
                 (long long)(c ? L->num_cmp_pages : L->num_pages), b, c ? "compressed rows" : "positions", x * per,
                 x * per + per - 1);
        return s;
    }
    case NSA_DRS_SHARED:
    case NSA_DRS_CMP_SHARED: {
        const int c = r[NSA_DR_REASON] == NSA_DRS_CMP_SHARED;
        snprintf(msg, size,
                 "nsa_decode: %s[%lld][%lld] = %d: sequence %lld writes %s there, but page %d appears %d times in the "
                 "batch's %spage tables (a page the step writes must belong to one sequence)",
                 c ? "cmp_block_table" : "block_table", b, x, (int)r[NSA_DR_ENTRY], b,
                 c ? "compressed rows" : "positions", (int)r[NSA_DR_ENTRY], (int)r[NSA_DR_COUNT],
                 c ? "compressed " : "");
        return s;
    }
    default:
        snprintf(msg, size, "nsa_decode: sequence %lld: the step's checks failed (reason %d)", b,
                 (int)r[NSA_DR_REASON]);
        return s;
    }
    snprintf(msg, size,
             "nsa_decode: sequence %lld: %s (cu_seqlens_q[%lld] = %d, cu_seqlens_q[%lld] = %d, TQ = %lld, TK0 = %lld, "
             "TK = %lld; limits: max_step_tokens %lld, max_total_tokens %lld, max_context %lld, max_pages %lld x "
             "page_size %lld, max_cmp_pages %lld x cmp_page_size %lld)",
             b, why, b, (int)r[NSA_DR_CU0], b + 1, (int)r[NSA_DR_CU1], tq, tk0, tk, (long long)L->max_step_tokens,
             (long long)L->max_total_tokens, (long long)L->max_context, (long long)L->max_pages, ps,
             (long long)L->max_cmp_pages, cps);
    return s;
}

#endif /* NSA_KERNELS_COMMON_NSA_DECODE_RECORD_H */

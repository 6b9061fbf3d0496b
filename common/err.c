/* SPDX-License-Identifier: MIT */
/* err.c - names of cq_err_t values for logs and messages. */
#include "coderq/common.h"

const char *cq_err_name(cq_err_t err)
{
        switch (err) {
        case CQ_OK:
                return "ok";
        case CQ_ERR_RETRIABLE:
                return "retriable";
        case CQ_ERR_FATAL:
                return "fatal";
        case CQ_ERR_TOO_LARGE:
                return "too large";
        }
        return "unknown";
}

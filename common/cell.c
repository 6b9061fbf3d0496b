/* SPDX-License-Identifier: MIT */
/* cell.c - cell results and the one table of cell status names. */
#include "coderq/common/cell.h"

#include <string.h>

const char *cq_cell_status_str(cq_cell_status_t status)
{
        switch (status) {
        case CQ_CELL_OK:
                return "ok";
        case CQ_CELL_ERROR:
                return "error";
        case CQ_CELL_TIMEOUT:
                return "timeout";
        case CQ_CELL_DIED:
                return "died";
        case CQ_CELL_CANCELLED:
                return "cancelled";
        }
        return NULL;
}

const char *cq_cell_status_name(cq_cell_status_t status)
{
        const char *name = cq_cell_status_str(status);

        return name ? name : "unknown";
}

void cq_cell_result_init(cq_cell_result_t *res)
{
        memset(res, 0, sizeof(*res));
        res->status = CQ_CELL_OK;
        res->execution_count = -1;
}

void cq_cell_result_release(cq_cell_result_t *res)
{
        json_decref(res->outputs);
        json_decref(res->timing);
        cq_cell_result_init(res);
}

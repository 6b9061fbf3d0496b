/* SPDX-License-Identifier: MIT */
/* main.c - the coderq executable. Process-wide initialisation that must
 * happen before any thread starts lives here and nowhere else. */
#include "coderq/cli/cli.h"

#include <locale.h>
#include <stdio.h>

#include "coderq/http/http.h"

int main(int argc, char **argv)
{
        int rc;

        setlocale(LC_ALL, "C");
        if (cq_http_global_init() != 0) {
                fprintf(stderr, "coderq: could not initialise libcurl\n");
                return CQ_EXIT_INTERNAL;
        }
        rc = cq_cli_main(argc, argv);
        cq_http_global_cleanup();
        return rc;
}

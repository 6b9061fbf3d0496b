/* SPDX-License-Identifier: MIT */
/* main.c - the coderq executable. Process-wide initialisation that must
 * happen before any thread starts lives here and nowhere else. */
#include "coderq/cli/cli.h"

#include <curl/curl.h>
#include <locale.h>
#include <stdio.h>

int main(int argc, char **argv)
{
        int rc;

        setlocale(LC_ALL, "C");
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
                fprintf(stderr, "coderq: could not initialise libcurl\n");
                return CQ_EXIT_INTERNAL;
        }
        rc = cq_cli_main(argc, argv);
        curl_global_cleanup();
        return rc;
}

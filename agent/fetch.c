/* SPDX-License-Identifier: MIT */
/* fetch.c - a capped HTTP GET for job input files. */
#include "coderq/fetch.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/buf.h"

static size_t on_body(char *p, size_t size, size_t n, void *opaque)
{
        cq_buf_t *buf = opaque;

        if (cq_buf_append(buf, p, size * n) != CQ_OK)
                return 0; /* makes curl fail with CURLE_WRITE_ERROR */
        return size * n;
}

cq_err_t cq_fetch_url(const char *url,
                      size_t max,
                      long timeout_s,
                      unsigned char **datap,
                      size_t *lenp,
                      char *errstr,
                      size_t errstr_size)
{
        CURL *curl = NULL;
        CURLcode cc;
        cq_buf_t buf;
        long status = 0;
        cq_err_t err = CQ_ERR_FATAL;

        cq_buf_init(&buf, max);
        if (strncmp(url, "http://", 7) != 0 &&
            strncmp(url, "https://", 8) != 0) {
                snprintf(errstr, errstr_size,
                         "could not fetch file: only http and https URLs are "
                         "allowed");
                goto out;
        }
        curl = curl_easy_init();
        if (!curl) {
                snprintf(errstr, errstr_size,
                         "could not fetch file: out of "
                         "memory");
                goto out;
        }
        curl_easy_setopt(curl, CURLOPT_URL, url);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#else
        curl_easy_setopt(curl, CURLOPT_PROTOCOLS,
                         (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
        curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS,
                         (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
        curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, 10L);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT,
                         timeout_s > 0 ? timeout_s : 120L);
        curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &buf);
        cc = curl_easy_perform(curl);
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        if (cc == CURLE_WRITE_ERROR || cc == CURLE_FILESIZE_EXCEEDED) {
                snprintf(errstr, errstr_size,
                         "could not fetch file: larger than %zu bytes", max);
                err = CQ_ERR_TOO_LARGE;
                goto out;
        }
        if (cc != CURLE_OK) {
                snprintf(errstr, errstr_size, "could not fetch file: %s",
                         curl_easy_strerror(cc));
                err = (cc == CURLE_UNSUPPORTED_PROTOCOL ||
                       cc == CURLE_URL_MALFORMAT)
                          ? CQ_ERR_FATAL
                          : CQ_ERR_RETRIABLE;
                goto out;
        }
        if (status < 200 || status > 299) {
                snprintf(errstr, errstr_size,
                         "could not fetch file: HTTP status %ld", status);
                err = (status == 429 || status >= 500) ? CQ_ERR_RETRIABLE
                                                       : CQ_ERR_FATAL;
                goto out;
        }
        *datap = (unsigned char *)cq_buf_take(&buf, lenp);
        if (!*datap) {
                snprintf(errstr, errstr_size,
                         "could not fetch file: out of "
                         "memory");
                goto out;
        }
        err = CQ_OK;
out:
        cq_buf_release(&buf);
        curl_easy_cleanup(curl);
        return err;
}

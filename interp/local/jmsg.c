/* SPDX-License-Identifier: MIT */
/* jmsg.c - Jupyter wire messages: HMAC-SHA256 signing, building, and the
 * authenticate-then-parse path for received frames. Nothing from the kernel
 * reaches the JSON parser before its size and signature were checked. */
#include "coderq/local/jmsg.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/core_names.h>
#include <openssl/params.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/common/util.h"

void cq_jmsg_init(cq_jmsg_t *msg) { memset(msg, 0, sizeof(*msg)); }

void cq_jmsg_release(cq_jmsg_t *msg)
{
        json_decref(msg->header);
        json_decref(msg->parent_header);
        json_decref(msg->metadata);
        json_decref(msg->content);
        cq_jmsg_init(msg);
}

int cq_jmsg_sign(const char *key,
                 size_t keylen,
                 const cq_jframe_t dicts[4],
                 char hex[CQ_JMSG_SIG_LEN + 1])
{
        static const char digits[] = "0123456789abcdef";
        unsigned char md[EVP_MAX_MD_SIZE];
        size_t mdlen = 0;
        EVP_MAC *mac = NULL;
        EVP_MAC_CTX *ctx = NULL;
        OSSL_PARAM params[2];
        char digest[] = "SHA256";
        int rc = -1, i;

        hex[0] = '\0';
        if (keylen == 0)
                return 0;
        mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
        ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
        if (!ctx)
                goto out;
        params[0] =
            OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0);
        params[1] = OSSL_PARAM_construct_end();
        if (!EVP_MAC_init(ctx, (const unsigned char *)key, keylen, params))
                goto out;
        for (i = 0; i < 4; i++)
                if (!EVP_MAC_update(ctx, dicts[i].data, dicts[i].len))
                        goto out;
        if (!EVP_MAC_final(ctx, md, &mdlen, sizeof(md)) ||
            mdlen * 2 != CQ_JMSG_SIG_LEN)
                goto out;
        for (i = 0; i < (int)mdlen; i++) {
                hex[2 * i] = digits[md[i] >> 4];
                hex[2 * i + 1] = digits[md[i] & 0xf];
        }
        hex[CQ_JMSG_SIG_LEN] = '\0';
        rc = 0;
out:
        EVP_MAC_CTX_free(ctx);
        EVP_MAC_free(mac);
        return rc;
}

void cq_jmsg_out_release(cq_jmsg_out_t *out)
{
        int i;

        for (i = 0; i < 4; i++) {
                free(out->frames[i]);
                out->frames[i] = NULL;
                out->lens[i] = 0;
        }
}

int cq_jmsg_build(const char *key,
                  size_t keylen,
                  const char *session,
                  uint64_t seq,
                  const char *msg_type,
                  json_t **contentp,
                  const json_t *parent,
                  cq_jmsg_out_t *out)
{
        json_t *content = *contentp;
        json_t *header = NULL, *meta = NULL;
        cq_jframe_t dicts[4];
        char date[40];
        int rc = -1, i;

        *contentp = NULL;
        memset(out, 0, sizeof(*out));
        if (!content)
                goto out;
        snprintf(out->msg_id, sizeof(out->msg_id), "%.36s_%llu", session,
                 (unsigned long long)seq);
        cq_iso8601_now(date, sizeof(date));
        header =
            json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "msg_id", out->msg_id,
                      "session", session, "username", "coderq", "date", date,
                      "msg_type", msg_type, "version", CQ_JMSG_VERSION);
        meta = json_object();
        if (!header || !meta)
                goto out;
        out->frames[0] = json_dumps(header, JSON_COMPACT);
        out->frames[1] =
            parent ? json_dumps(parent, JSON_COMPACT) : strdup("{}");
        out->frames[2] = json_dumps(meta, JSON_COMPACT);
        out->frames[3] = json_dumps(content, JSON_COMPACT | JSON_ALLOW_NUL);
        for (i = 0; i < 4; i++) {
                if (!out->frames[i])
                        goto out;
                out->lens[i] = strlen(out->frames[i]);
                dicts[i].data = out->frames[i];
                dicts[i].len = out->lens[i];
        }
        if (cq_jmsg_sign(key, keylen, dicts, out->sig))
                goto out;
        rc = 0;
out:
        json_decref(header);
        json_decref(meta);
        json_decref(content);
        return rc;
}

json_t *cq_jmsg_loads(const void *data, size_t len)
{
        json_error_t jerr;
        json_t *value;
        char *fixed;
        size_t fixedlen;

        value = json_loadb(data, len, JSON_ALLOW_NUL, &jerr);
        if (value || cq_utf8_valid(data, len))
                return value;
        /* Python sends lone surrogates as raw bytes (surrogateescape);
         * jupyter_client decodes with "replace", so do the same rather
         * than lose the whole output. */
        fixed = cq_utf8_repair(data, len, &fixedlen);
        if (!fixed)
                return NULL;
        value = json_loadb(fixed, fixedlen, JSON_ALLOW_NUL, &jerr);
        free(fixed);
        return value;
}

static cq_jmsg_drop_t drop(cq_jmsg_drop_t why,
                           cq_jmsg_stats_t *stats,
                           char *errstr,
                           size_t errstr_size,
                           const char *reason)
{
        if (stats) {
                switch (why) {
                case CQ_JMSG_DROP_MALFORMED:
                        stats->malformed++;
                        break;
                case CQ_JMSG_DROP_OVERSIZE:
                        stats->oversize++;
                        break;
                case CQ_JMSG_DROP_SIGNATURE:
                        stats->bad_signature++;
                        break;
                case CQ_JMSG_DROP_NONE:
                        break;
                }
        }
        cq_errstr_set(errstr, errstr_size, "dropped kernel message: %s",
                      reason);
        return why;
}

cq_jmsg_drop_t cq_jmsg_parse(const char *key,
                             size_t keylen,
                             const cq_jframe_t *frames,
                             size_t nframes,
                             size_t max_frame,
                             cq_jmsg_t *msg,
                             cq_jmsg_stats_t *stats,
                             char *errstr,
                             size_t errstr_size)
{
        static const size_t dlen = sizeof(CQ_JMSG_DELIM) - 1;
        static const char *const names[4] = {"header", "parent_header",
                                             "metadata", "content"};
        json_t *dicts[4] = {NULL, NULL, NULL, NULL};
        const cq_jframe_t *sig;
        char expect[CQ_JMSG_SIG_LEN + 1];
        json_t *v;
        size_t i, d;

        cq_jmsg_init(msg);
        if (nframes > CQ_JMSG_MAX_FRAMES)
                return drop(CQ_JMSG_DROP_MALFORMED, stats, errstr, errstr_size,
                            "too many frames");
        for (d = 0; d < nframes; d++) {
                if (frames[d].len > max_frame)
                        return drop(CQ_JMSG_DROP_OVERSIZE, stats, errstr,
                                    errstr_size, "frame above the size cap");
        }
        for (d = 0; d < nframes; d++)
                if (frames[d].len == dlen &&
                    memcmp(frames[d].data, CQ_JMSG_DELIM, dlen) == 0)
                        break;
        if (d == nframes)
                return drop(CQ_JMSG_DROP_MALFORMED, stats, errstr, errstr_size,
                            "no <IDS|MSG> delimiter");
        if (nframes - d - 1 < 5)
                return drop(CQ_JMSG_DROP_MALFORMED, stats, errstr, errstr_size,
                            "fewer than five frames after the "
                            "delimiter");
        sig = &frames[d + 1];
        if (keylen) {
                if (sig->len != CQ_JMSG_SIG_LEN)
                        return drop(CQ_JMSG_DROP_SIGNATURE, stats, errstr,
                                    errstr_size,
                                    "signature is not 64 characters");
                if (cq_jmsg_sign(key, keylen, &frames[d + 2], expect))
                        return drop(CQ_JMSG_DROP_SIGNATURE, stats, errstr,
                                    errstr_size, "could not compute HMAC");
                if (CRYPTO_memcmp(expect, sig->data, CQ_JMSG_SIG_LEN) != 0)
                        return drop(CQ_JMSG_DROP_SIGNATURE, stats, errstr,
                                    errstr_size, "signature mismatch");
        }
        for (i = 0; i < 4; i++) {
                const cq_jframe_t *f = &frames[d + 2 + i];

                dicts[i] = cq_jmsg_loads(f->data, f->len);
                if (!json_is_object(dicts[i])) {
                        char why[64];
                        size_t k;

                        snprintf(why, sizeof(why), "%s is not a JSON object",
                                 names[i]);
                        for (k = 0; k <= i; k++)
                                json_decref(dicts[k]);
                        return drop(CQ_JMSG_DROP_MALFORMED, stats, errstr,
                                    errstr_size, why);
                }
        }
        msg->header = dicts[0];
        msg->parent_header = dicts[1];
        msg->metadata = dicts[2];
        msg->content = dicts[3];
        msg->msg_type =
            json_string_value(json_object_get(dicts[0], "msg_type"));
        msg->msg_id = json_string_value(json_object_get(dicts[0], "msg_id"));
        if (!msg->msg_type || !msg->msg_id) {
                cq_jmsg_release(msg);
                return drop(CQ_JMSG_DROP_MALFORMED, stats, errstr, errstr_size,
                            "header lacks msg_id or msg_type");
        }
        v = json_object_get(dicts[1], "msg_id");
        msg->parent_id = json_string_value(v);
        if (stats)
                stats->received++;
        return CQ_JMSG_DROP_NONE;
}

/* SPDX-License-Identifier: MIT */
/* e2b_int.h - what the files of the E2B backend share: the handle, the
 * fleet, one HTTP request with E2B's retry policy (struct call) and the
 * functions one file calls in another. Not a public header. */
#ifndef CODERQ_E2B_INT_H
#define CODERQ_E2B_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "coderq/common/buf.h"
#include "coderq/e2b/e2b.h"
#include "coderq/http/http.h"

#define HOME_DIR      "/home/user"
#define ENVD_PORT     49983
#define CI_PORT       49999
#define LIST_DEPTH    32
#define MAX_ENTRIES   20000
#define MAX_ERR_BODY  2048
#define ID_MAX        64
#define TOKEN_MAX     256
#define USER_AGENT    "coderq/" CQ_VERSION
#define DEF_TEMPLATE  "code-interpreter-v1"
#define DEF_DOMAIN    "e2b.app"
#define DEF_CREATE    "/v2/sandboxes"
#define CONNECT_MS    10000L
#define KILL_ATTEMPTS 3
#define KILL_MS       15000L /* each kill attempt's deadline */
/* a context restart: tries, and the deadline of each */
#define RESTART_ATTEMPTS 2
#define RESTART_MS       20000L
#define NONCE_LEN        16
#define LIST_PAGES       20
#define TAG_CREATE       "coderq_create"
#define TAG_WORKER       "coderq_worker"
#define TAG_JOB          "coderq_job"
#define TAG_ATTEMPT      "coderq_attempt"

enum plane { PLANE_API, PLANE_ENVD, PLANE_CI, PLANE_CI_NOTOKEN };

struct input_file {
        char *name;
        unsigned char *data;
        size_t len;
};

typedef struct cq_e2b {
        cq_interp_t base; /* first: cq_interp_t * casts to cq_e2b_t * */
        /* settings, copied */
        char *api_key, *domain, *api_url, *sandbox_url, *template_id,
            *create_path;
        int ttl_s, max_attempts, retry_base_ms, retry_max_ms,
            request_timeout_ms, probe_timeout_ms;
        size_t max_line, max_output, max_body, max_file;
        /* the sandbox; written by the owner thread under lock, read by
         * cq_e2b_keepalive() under lock */
        pthread_mutex_t lock;
        char sandbox_id[ID_MAX];
        char envd_token[TOKEN_MAX];
        char traffic_token[TOKEN_MAX];
        char *sandbox_domain; /* from the Sandbox body, or NULL */
        char context_id[ID_MAX];
        int64_t expires_ms;         /* our view of the TTL end, monotonic */
        int64_t next_extend_try_ms; /* owner thread only */
        /* what no message may show: api_key, envd_token, traffic_token */
        const char *secrets[3];
        /* owner thread only */
        cq_http_t *http;
        cq_http_t *aux;   /* lifetime extensions while http streams a cell */
        json_t *snapshot; /* {relpath: "size|mtime"} at sandbox start */
        struct input_file *inputs;
        size_t ninputs;
        bool lost;       /* a data-plane 502 said the sandbox is gone */
        json_t *env;     /* cq_interp_env(), once probed */
        bool env_probed; /* probed, whatever came of it */
        /* rand_r() state, for a nonce when getrandom() fails */
        unsigned int rng;
        atomic_int interrupt;
        char errbuf[1024];
        /* metadata tags of our sandboxes, so strays can be found */
        char *tag_job, *tag_worker;
        int tag_attempt, max_timeout_s;
        /* coderq_create tag of the adopted sandbox and of the one being
         * created; under lock (the fleet reads them) */
        char nonce[NONCE_LEN + 1];
        char pending[NONCE_LEN + 1];
        /* membership of a fleet; under fleet->lock */
        struct cq_e2b_fleet *fleet;
        struct cq_e2b *fleet_next;
        int fleet_refs;
} cq_e2b_t;

struct cq_e2b_fleet {
        pthread_mutex_t lock;
        pthread_cond_t cond; /* a member's fleet_refs dropped */
        cq_e2b_t *members;
        cq_e2b_t *api; /* no sandbox: list and kill; housekeeping only */
};

struct call {
        const char *what; /* "create E2B sandbox" for messages */
        enum plane plane;
        const char *method; /* GET, POST, DELETE */
        const char *url;
        const char *ctype; /* request Content-Type, or NULL */
        const void *body;
        size_t body_len;
        curl_mime *mime;    /* borrowed, or NULL */
        const long *ok;     /* accepted statuses, 0-terminated */
        size_t max_reply;   /* 0: e2b->max_body */
        int attempts;       /* 0: e2b->max_attempts */
        int64_t timeout_ms; /* each attempt's; 0: e2b->request_timeout_ms */
        /* Where errors go, when not the handle's own (cq_e2b_keepalive()
         * runs beside the owner thread). */
        char *errbuf;
        size_t errbuf_size;
        /* out */
        long status; /* 0 when no whole reply came */
        cq_buf_t reply;
        CURLcode curl_rc;       /* of the last attempt */
        int should_retry;       /* Should-Retry of the last reply, or -1 */
        int64_t retry_after_ms; /* Retry-After of the last reply, or -1 */
        char next_token[256];   /* X-Next-Token of the last reply */
};

/* e2b_err.c: error messages */

CQ_PRINTF(2, 3) void e2b_set_error(cq_e2b_t *e2b, const char *fmt, ...);
CQ_PRINTF(3, 4)
void e2b_call_error(cq_e2b_t *e2b, struct call *call, const char *fmt, ...);

/* e2b_http.c: requests */

int e2b_dp_base(cq_e2b_t *e2b, int port, char *out, size_t size);
struct curl_slist *
e2b_make_headers(cq_e2b_t *e2b, enum plane plane, const char *ctype);
cq_http_t *e2b_http_new(cq_e2b_t *e2b);
void e2b_call_init(struct call *call,
                   const char *what,
                   enum plane plane,
                   const char *method,
                   const char *url,
                   const long *ok);
void e2b_call_json(struct call *call, const char *body);
void e2b_reply_reason(const cq_buf_t *reply, char *out, size_t size);
void e2b_backoff_sleep(cq_e2b_t *e2b, int attempt, int64_t retry_after_ms);
cq_err_t e2b_call_run(cq_e2b_t *e2b, cq_http_t *http, struct call *call);
extern const long e2b_ok_201[];
extern const long e2b_ok_200[];
extern const long e2b_ok_204[];
extern const long e2b_ok_kill[];

/* e2b_sandbox.c: the sandbox */

cq_err_t e2b_kill_sandbox(cq_e2b_t *e2b, const char *id);
void e2b_make_nonce(cq_e2b_t *e2b, char *out);
cq_err_t e2b_list_tagged(cq_e2b_t *e2b,
                         const char *key,
                         const char *value,
                         json_t **idsp);
cq_err_t e2b_set_timeout_on(cq_e2b_t *e2b,
                            cq_http_t *http,
                            int timeout_s,
                            long *statusp,
                            char *errbuf,
                            size_t errbuf_size,
                            int attempts);
cq_err_t e2b_maybe_extend(cq_e2b_t *e2b, int64_t cell_timeout_ms);
cq_err_t
e2b_keepalive(cq_e2b_t *e2b, int attempts, char *errstr, size_t errstr_size);
cq_err_t e2b_restart_context(cq_e2b_t *e2b);
bool e2b_sandbox_alive(cq_e2b_t *e2b);
cq_err_t e2b_start_sandbox(cq_e2b_t *e2b);
cq_err_t e2b_replace_sandbox(cq_e2b_t *e2b);

/* e2b_files.c: files */

cq_err_t
e2b_upload(cq_e2b_t *e2b, const char *name, const void *data, size_t len);
cq_err_t e2b_put_file(cq_interp_t *interp,
                      const char *name,
                      const void *data,
                      size_t len);
cq_err_t e2b_get_file(cq_interp_t *interp,
                      const char *name,
                      size_t max,
                      cq_file_t *file);
cq_err_t e2b_list_files(cq_e2b_t *e2b, json_t **listp);
cq_err_t
e2b_created_files(cq_interp_t *interp, bool with_data, cq_files_t *files);

/* e2b_exec.c: cells */

cq_err_t e2b_execute(cq_interp_t *interp,
                     const char *code,
                     const cq_exec_opts_t *opts,
                     cq_cell_result_t *res);
int e2b_interrupt(cq_interp_t *interp);
cq_err_t e2b_restart(cq_interp_t *interp);
const json_t *e2b_env(cq_interp_t *interp);

#endif

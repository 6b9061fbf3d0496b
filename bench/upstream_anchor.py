# SPDX-License-Identifier: MIT
"""upstream_anchor.py - the anchor of `scripts/bench.sh upstream`: the
upstream Python CoderAgent (MathModelAgent's backend, from a checkout the
user names) running small jobs against the same scripted fake LLM as
`coderq run`, as its own workflow runs them: LocalCodeInterpreter (a
jupyter_client kernel and its pre-execute cell), then CoderAgent.run().

usage: PYTHON upstream_anchor.py CHECKOUT LLM_BASE_URL MODEL WORK_DIR
           [--jobs N] [--shared-kernel]

--jobs N runs N jobs in this one process (the app's imports paid once);
each gets a kernel of its own, as coderq's jobs do, unless
--shared-kernel, which runs them as the subtasks of one task (upstream's
own shape: one kernel, one history for all). Redis publishing (the web
UI's stream) is replaced by a no-op; nothing else of upstream changes.
Prints one JSON line: wall seconds of setup (imports) and per job, and
whether every job's answer was the scripted one."""

import argparse
import asyncio
import json
import os
import sys
import time

T0 = time.monotonic()


def main():
    ap = argparse.ArgumentParser(description='the upstream CoderAgent anchor')
    ap.add_argument('checkout')
    ap.add_argument('base_url')
    ap.add_argument('model')
    ap.add_argument('work')
    ap.add_argument('--jobs', type=int, default=1)
    ap.add_argument('--shared-kernel', action='store_true')
    a = ap.parse_args()
    checkout, base_url, model, work = a.checkout, a.base_url, a.model, a.work
    jobs, shared = a.jobs, a.shared_kernel
    sys.path.insert(0, os.path.join(checkout, 'backend'))
    os.environ.update(CODER_API_TYPE='openai-chat', CODER_API_KEY='bench',
                      CODER_MODEL=model, CODER_BASE_URL=base_url,
                      LOG_LEVEL='WARNING')
    from app.services.redis_manager import redis_manager

    async def no_publish(*_args, **_kw):
        return None

    redis_manager.publish_message = no_publish
    from app.config.setting import ApiType
    from app.core.agents.coder_agent import CoderAgent
    from app.core.llm.llm import LLM
    from app.tools.local_interpreter import LocalCodeInterpreter
    from app.tools.notebook_serializer import NotebookSerializer
    imported = time.monotonic()

    async def run():
        answers, per_job = [], []
        agent = interp = None
        for i in range(jobs):
            t = time.monotonic()
            wd = work if shared else os.path.join(work, 'job-%d' % i)
            os.makedirs(wd, exist_ok=True)
            if interp is None or not shared:
                interp = LocalCodeInterpreter(
                    task_id='bench-%d' % i, work_dir=wd,
                    notebook_serializer=NotebookSerializer(work_dir=wd))
                await interp.initialize()
                llm = LLM(api_type=ApiType.OPENAI_CHAT, api_key='bench',
                          model=model, base_url=base_url,
                          task_id='bench-%d' % i)
                agent = CoderAgent(task_id='bench-%d' % i, model=llm,
                                   work_dir=wd, max_chat_turns=None,
                                   max_retries=5, code_interpreter=interp)
            reply = await agent.run('Compute 6*7 and print it.', 'job %d' % i)
            answers.append(reply.code_response)
            if not shared:
                await interp.cleanup()
            per_job.append(time.monotonic() - t)
        if shared:
            await interp.cleanup()
        return answers, per_job

    answers, per_job = asyncio.run(run())
    print(json.dumps({'jobs': jobs, 'shared_kernel': shared,
                      'import_s': round(imported - T0, 3),
                      'job_s': [round(s, 3) for s in per_job],
                      'total_s': round(time.monotonic() - T0, 3),
                      'answers_ok': all(a == 'x is 42.' for a in answers)}))


if __name__ == '__main__':
    main()

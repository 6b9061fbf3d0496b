/* SPDX-License-Identifier: MIT */
/* commands.h - the commands in consumer/cmd_<name>.c that cli.c's table
 * names; internal to consumer/. One line per command. */
#ifndef CODERQ_COMMANDS_H
#define CODERQ_COMMANDS_H

#include "coderq/cli.h"

/* cmd_doctor.c: check that every service and tool coderq needs answers. */
cq_cmd_fn_t cq_cmd_doctor;
extern const char cq_cmd_doctor_usage[];

#endif

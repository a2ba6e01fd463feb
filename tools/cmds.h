/*
 * The subcommands of the nsa command. Each takes the arguments after the
 * subcommand name (argv[0] is the subcommand itself) and returns the process
 * exit code (see tool.h).
 */
#ifndef NSA_TOOLS_CMDS_H
#define NSA_TOOLS_CMDS_H

int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_parity(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif /* NSA_TOOLS_CMDS_H */

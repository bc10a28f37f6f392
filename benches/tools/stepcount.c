/*
 * stepcount: counts the instructions a thread runs between consecutive arrivals at an
 * address, by single-stepping it under ptrace.
 *
 *   stepcount TID ADDR ROUNDS [TRACE]
 *
 * Seizes thread TID (PTRACE_SEIZE, then an interrupt), steps it until it reaches ADDR (hex),
 * then prints, ROUNDS times, how many instructions it ran until it reached ADDR again (one
 * number a line), and detaches. TRACE, if given, receives the address of every instruction of
 * the last round, one hex number a line. Used by insns-per-hit; needs the right to trace TID.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>

#define MAX_TRACE 1000000

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: stepcount TID ADDR ROUNDS [TRACE]\n");
    return 2;
  }
  pid_t tid = (pid_t)atoi(argv[1]);
  unsigned long long addr = strtoull(argv[2], NULL, 16);
  int rounds = atoi(argv[3]);
  FILE *trace = NULL;
  if (argc == 5 && !(trace = fopen(argv[4], "w"))) {
    fprintf(stderr, "stepcount: %s: %s\n", argv[4], strerror(errno));
    return 1;
  }
  unsigned long long *rips = malloc(sizeof *rips * MAX_TRACE);
  if (!rips || tid <= 0 || rounds < 1)
    return 2;
  if (ptrace(PTRACE_SEIZE, tid, 0, 0) != 0 || ptrace(PTRACE_INTERRUPT, tid, 0, 0) != 0) {
    fprintf(stderr, "stepcount: seize %d: %s\n", (int)tid, strerror(errno));
    return 1;
  }
  int status;
  if (waitpid(tid, &status, __WALL) != tid)
    return 1;
  long steps = 0, kept = 0;
  int arrivals = 0;
  for (;;) {
    if (ptrace(PTRACE_SINGLESTEP, tid, 0, 0) != 0 || waitpid(tid, &status, __WALL) != tid) {
      fprintf(stderr, "stepcount: step: %s\n", strerror(errno));
      return 1;
    }
    if (!WIFSTOPPED(status)) {
      fprintf(stderr, "stepcount: the thread ended\n");
      return 1;
    }
    struct user_regs_struct regs;
    if (ptrace(PTRACE_GETREGS, tid, 0, &regs) != 0)
      return 1;
    if (regs.rip == addr) {
      if (arrivals > 0)
        printf("%ld\n", steps);
      if (arrivals == rounds)
        break;
      arrivals++;
      steps = 0;
      kept = 0;
    }
    steps++;
    if (kept < MAX_TRACE)
      rips[kept++] = regs.rip;
  }
  if (trace) {
    for (long i = 0; i < kept; i++)
      fprintf(trace, "%llx\n", rips[i]);
    fclose(trace);
  }
  ptrace(PTRACE_DETACH, tid, 0, 0);
  return 0;
}

/*
 * bench_handler: the handler library the hitcost benchmark loads into uprobe-run.
 *
 * Parameters (uprobe-run --param NAME=VALUE):
 *   func=SYM         probe SYM with the kind below
 *   kind=K           entry (uprobe), return (uretprobe, return handler only) or
 *                    entry+return (uretprobe with an entry_handler); default entry
 *   empty=1          with kind=entry+return: handlers that do next to nothing (a plain add
 *                    to a counter, so that the hits can still be checked: single-threaded
 *                    rows only), with 16 bytes of ri->data as --latency uses: the floor a
 *                    handler-based measurement starts from; with kind=entry: the same for
 *                    an entry probe (its handler's code is read and found free of vector
 *                    instructions, and it has no locked instruction, which would wait for
 *                    the hit's register frame to leave the store buffer)
 *   novec=1          with kind=entry: the probe declares UPROBE_NO_VECTORS (its handler, an
 *                    atomic add, touches no vector register), so the jump skips their save
 *                    (without it, the runtime reads the handler's code and finds the same)
 *   fp=1             with kind=entry: the handler also adds 1.0 to a double, so the jump
 *                    saves the vector registers around it (a handler of a program that
 *                    computes in floating point, or calls libc)
 *   probes=N         also put an entry probe on each of the fixture's p0000 .. p(N-1)
 *   probe_file=PATH  also put an entry probe on every "sym" or "module:sym" line of PATH
 *
 * Handlers only count, with relaxed atomic adds into a counter slot chosen by the calling
 * thread, so that threads hitting the same probe do not also fight over one cache line of
 * this library (which would be charged to the runtime). At exit one line goes to the run's
 * output:
 *   entries=E returns=R others=O registered=G failed=F
 * followed by one "failed_errno=N count=C" line per errno that a registration returned.
 * A failed registration of func is fatal: "error=CALL(SYM): RESULT" and uprobe_init fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "uprobe.h"

#define MAX_ERRNO 4096

enum kind { KIND_ENTRY, KIND_RETURN, KIND_BOTH };

/* Per-thread-ish counters: one cache line each, picked by hashing the thread pointer. Two
 * threads that land on the same slot still count correctly (the adds are atomic). */
#define SLOTS 64
struct slot {
  unsigned long entries, returns, others;
} __attribute__((aligned(64)));
static struct slot slots[SLOTS];

static struct slot *my_slot(void) {
  unsigned long tp;
  __asm__("mov %%fs:0, %0" : "=r"(tp)); /* x86-64 TCB self pointer: distinct per thread */
  return &slots[((tp >> 12) * 0x9E3779B97F4A7C15ul) >> 58];
}

static int registered, failed;
static unsigned failed_by_errno[MAX_ERRNO];

static struct uprobe entry_probe;
static struct uretprobe return_probe;

/* Signal context: only the atomic add. */
static void on_entry(struct uprobe *u, struct pt_regs *regs) {
  (void)u;
  (void)regs;
  __atomic_fetch_add(&my_slot()->entries, 1, __ATOMIC_RELAXED);
}

static volatile double fp_total;

static void on_entry_fp(struct uprobe *u, struct pt_regs *regs) {
  (void)u;
  (void)regs;
  __atomic_fetch_add(&my_slot()->entries, 1, __ATOMIC_RELAXED);
  fp_total = fp_total + 1.0;
}

static int on_entry_of_return_probe(struct uretprobe_instance *ri, struct pt_regs *regs) {
  (void)ri;
  (void)regs;
  __atomic_fetch_add(&my_slot()->entries, 1, __ATOMIC_RELAXED);
  return 0;
}

static void on_return(struct uretprobe_instance *ri, struct pt_regs *regs) {
  (void)ri;
  (void)regs;
  __atomic_fetch_add(&my_slot()->returns, 1, __ATOMIC_RELAXED);
}

/* empty=1: single-threaded rows only, so plain adds count exactly. */
static unsigned long plain_entries, plain_returns;

static int on_entry_empty(struct uretprobe_instance *ri, struct pt_regs *regs) {
  (void)ri;
  (void)regs;
  plain_entries++;
  return 0;
}

static void on_hit_empty(struct uprobe *u, struct pt_regs *regs) {
  (void)u;
  (void)regs;
  plain_entries++;
}

static void on_return_empty(struct uretprobe_instance *ri, struct pt_regs *regs) {
  (void)ri;
  (void)regs;
  plain_returns++;
}

static void on_other(struct uprobe *u, struct pt_regs *regs) {
  (void)u;
  (void)regs;
  __atomic_fetch_add(&my_slot()->others, 1, __ATOMIC_RELAXED);
}

static void tally(int rc) {
  if (rc == 0) {
    registered++;
    return;
  }
  failed++;
  int e = rc < 0 ? -rc : rc;
  if (e < MAX_ERRNO)
    failed_by_errno[e]++;
}

/* Registers an entry probe on each name; the uprobe objects live until exit. */
static int probe_names(char **names, int count) {
  struct uprobe *probes = calloc((size_t)count, sizeof *probes);
  if (!probes)
    return -ENOMEM;
  for (int i = 0; i < count; i++) {
    probes[i].symbol_name = names[i];
    probes[i].handler = on_other;
    tally(register_uprobe(&probes[i]));
  }
  return 0;
}

static int probe_numbered(long n) {
  if (n < 0 || n > 100000)
    return -EINVAL;
  char **names = calloc((size_t)n, sizeof *names);
  if (!names)
    return -ENOMEM;
  for (long i = 0; i < n; i++) {
    char name[24];
    snprintf(name, sizeof name, "p%04ld", i);
    names[i] = strdup(name);
    if (!names[i])
      return -ENOMEM;
  }
  return probe_names(names, (int)n);
}

static char *read_file(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return NULL;
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap + 1);
  for (;;) {
    if (!buf)
      break;
    if (len == cap) {
      char *bigger = realloc(buf, 2 * cap + 1);
      if (!bigger) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = bigger;
      cap *= 2;
    }
    ssize_t got = read(fd, buf + len, cap - len);
    if (got < 0) {
      free(buf);
      buf = NULL;
      break;
    }
    if (got == 0) {
      buf[len] = '\0';
      break;
    }
    len += (size_t)got;
  }
  close(fd);
  return buf;
}

static int probe_file(const char *path) {
  char *text = read_file(path);
  if (!text)
    return -errno;
  int count = 0;
  for (char *p = text; *p; p++)
    count += *p == '\n';
  char **names = calloc((size_t)count + 1, sizeof *names);
  if (!names)
    return -ENOMEM;
  int n = 0;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
    if (*line)
      names[n++] = line;
  return probe_names(names, n);
}

int uprobe_init(void) {
  const char *func = uprobe_param("func");
  const char *kind_name = uprobe_param("kind");
  const char *probes = uprobe_param("probes");
  const char *file = uprobe_param("probe_file");
  const char *empty = uprobe_param("empty");
  enum kind kind = KIND_ENTRY;

  if (kind_name && strcmp(kind_name, "return") == 0)
    kind = KIND_RETURN;
  else if (kind_name && strcmp(kind_name, "entry+return") == 0)
    kind = KIND_BOTH;
  else if (kind_name && strcmp(kind_name, "entry") != 0) {
    uprobe_printf("error=bench_handler: unknown kind %s\n", kind_name);
    return 1;
  }

  if (func) {
    int rc;
    if (kind == KIND_ENTRY) {
      entry_probe.symbol_name = func;
      const char *fp = uprobe_param("fp");
      entry_probe.handler = fp && strcmp(fp, "1") == 0 ? on_entry_fp : on_entry;
      if (empty && strcmp(empty, "1") == 0)
        entry_probe.handler = on_hit_empty;
      const char *novec = uprobe_param("novec");
      if (novec && strcmp(novec, "1") == 0)
        entry_probe.flags = UPROBE_NO_VECTORS;
      rc = register_uprobe(&entry_probe);
      if (rc != 0) {
        uprobe_printf("error=register_uprobe(%s): %d\n", func, rc);
        return 1;
      }
    } else {
      return_probe.u.symbol_name = func;
      return_probe.handler = on_return;
      if (kind == KIND_BOTH)
        return_probe.entry_handler = on_entry_of_return_probe;
      if (kind == KIND_BOTH && empty && strcmp(empty, "1") == 0) {
        return_probe.handler = on_return_empty;
        return_probe.entry_handler = on_entry_empty;
        return_probe.data_size = 16;
      }
      rc = register_uretprobe(&return_probe);
      if (rc != 0) {
        uprobe_printf("error=register_uretprobe(%s): %d\n", func, rc);
        return 1;
      }
    }
  }
  if (probes) {
    int rc = probe_numbered(atol(probes));
    if (rc != 0) {
      uprobe_printf("error=bench_handler: probes=%s: %d\n", probes, rc);
      return 1;
    }
  }
  if (file) {
    int rc = probe_file(file);
    if (rc != 0) {
      uprobe_printf("error=bench_handler: probe_file=%s: %d\n", file, rc);
      return 1;
    }
  }
  return 0;
}

void uprobe_exit(void) {
  unsigned long entries = 0, returns = 0, others = 0;
  for (int i = 0; i < SLOTS; i++) {
    entries += __atomic_load_n(&slots[i].entries, __ATOMIC_RELAXED);
    returns += __atomic_load_n(&slots[i].returns, __ATOMIC_RELAXED);
    others += __atomic_load_n(&slots[i].others, __ATOMIC_RELAXED);
  }
  entries += plain_entries;
  returns += plain_returns;
  uprobe_printf("entries=%lu returns=%lu others=%lu registered=%d failed=%d\n", entries, returns,
                others, registered, failed);
  for (int e = 0; e < MAX_ERRNO; e++)
    if (failed_by_errno[e])
      uprobe_printf("failed_errno=%d count=%u\n", e, failed_by_errno[e]);
}

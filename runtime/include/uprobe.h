/*
 * uprobe.h - the C ABI of libuprobe.so, the in-process user-space probe runtime.
 *
 * Handler libraries include this header. They need not link against libuprobe.so:
 * `uprobe-run` preloads it, so the symbols below resolve when the library is loaded.
 *
 * Handlers run in signal context on the trap path: call only async-signal-safe
 * functions from them (uprobe_printf is one; printf and malloc are not).
 */
#ifndef UPROBE_H
#define UPROBE_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct pt_regs {            /* x86_64 kernel UAPI order and names */
  unsigned long r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8,
                rax, rcx, rdx, rsi, rdi, orig_rax, rip, cs, eflags, rsp, ss;
};
#define regs_return_value(regs) ((regs)->rax)

enum uprobe_type { UPTY_UPROBE, UPTY_URETPROBE };

/*
 * struct uprobe's flags (zero: none; a value with bits this runtime does not know counts as
 * zero, so a probe object whose padding holds garbage stays safe).
 *
 * UPROBE_NO_VECTORS: the probe's handler touches no vector or floating-point register: no
 * float or double, no SSE/AVX intrinsics, no call into code that may (libc's memcpy, memset,
 * strlen and printf do; uprobe_printf does not). A jump probe whose handlers all say so skips
 * saving xmm0-15 (or, with --full-vector-state, the whole XSAVE state) around them; one
 * probe at the place without the flag keeps the save for all. A handler that breaks the
 * promise corrupts the probed program's floating-point values: build such handlers with
 * -mgeneral-regs-only to let the compiler check it. A return probe (struct uretprobe) sets
 * it in rp.u.flags for its entry handler and its return handler together: its entry and its
 * return then skip the save.
 * A probe without the flag has its handlers' code read at registration: where every
 * instruction reachable from each handler (through branches and direct calls) is a
 * general-purpose one and none calls or jumps through a pointer (a call through the PLT,
 * into libc or the runtime, is one), the handler cannot touch those registers, and the probe
 * skips the save as if it had the flag. `uprobe-run --verbose` says what was found for each
 * handler ("handler NAME touches no vector register", or the first instruction in the way).
 *
 * Bit 31 is the runtime's own (its trace events that read %xmmN set it on their probes); a
 * handler library leaves it 0 (set, it only counts as an unknown bit: the save is kept).
 */
#define UPROBE_NO_VECTORS 1u

struct uprobe {
  pid_t pid;               /* 0 or getpid(): the runtime probes its own process */
  unsigned int flags;      /* UPROBE_* flags above; 0 by default                  */
  unsigned long vaddr;     /* run-time address of the probed instruction        */
  void (*handler)(struct uprobe *u, struct pt_regs *regs);
  void (*registration_callback)(struct uprobe *u, int reg,
                                enum uprobe_type type, int result);
  const char *symbol_name; /* kprobe-style alternative to vaddr: "sym" or "module:sym" */
  unsigned long offset;    /* added to symbol_name's address                          */
  /* fields reserved for the runtime: zero them (static storage or memset) */
  void *reserved[4];
};

struct uretprobe_instance;
struct uretprobe {
  struct uprobe u;
  void (*handler)(struct uretprobe_instance *ri, struct pt_regs *regs);
  int  (*entry_handler)(struct uretprobe_instance *ri, struct pt_regs *regs); /* !=0: skip this return */
  size_t data_size;        /* per-instance private data, ri->data */
  int maxactive;           /* per-thread pending returns; <=0: default */
  unsigned long nmissed;   /* returns not probed for lack of room     */
};
struct uretprobe_instance {
  struct uretprobe *rp;
  unsigned long ret_addr;
  unsigned long reserved[2];
  char data[];
};

int  register_uprobe(struct uprobe *u);
void unregister_uprobe(struct uprobe *u);
/* num probes at once: probes at one address stop together, one grace period for all */
void unregister_uprobes(struct uprobe **us, int num);
int  register_uretprobe(struct uretprobe *rp);
void unregister_uretprobe(struct uretprobe *rp);

const char   *uprobe_param(const char *name);      /* value of `--param name=value`, or NULL   */
int           uprobe_printf(const char *fmt, ...);  /* async-signal-safe, to the run's output */
unsigned long uprobe_lookup(const char *spec);     /* "sym", "module:sym+off" -> address, 0 if none */

/* Optional exports of a handler library; a library must export at least one of them.
 *
 * uprobe_init: after loading, in command-line order; non-zero aborts the run.
 * uprobe_exit: once per process when it really ends, in reverse order, and only for
 *   libraries whose uprobe_init succeeded: return from main, exit, _exit/_Exit, a signal
 *   whose default action ends the process (SIGINT, SIGTERM, SIGSEGV, SIGABRT...; the
 *   process then dies of that same signal), or exec (before the new program starts).
 *   After a fatal signal it runs inside the signal handler: call only async-signal-safe
 *   functions there (uprobe_printf is one) if the report must survive a crash in malloc.
 *   SIGKILL, a raw exit_group system call and a fault with SIGSEGV blocked end the
 *   process without it. A fault in uprobe_init or uprobe_exit is reported by name. */
int  uprobe_init(void);
void uprobe_exit(void);

#ifdef __cplusplus
}
#endif

#endif /* UPROBE_H */

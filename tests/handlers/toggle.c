/*
 * toggle.c - registers and unregisters probes while the program's threads run the probed
 * code. At init (one thread): a permanent probe on inner() and a probe on work(), both jump
 * probes where the code allows. Then a thread of its own, once the program says `started`:
 * 1000 times, unregisters the work() probe (the first time, a live jump removal) and
 * registers it again, and does the same with a probe on work()'s second instruction; then
 * sets the program's `done`. At exit: the hits of each probe and the failed calls.
 */
#include "uprobe.h"

#include <pthread.h>
#include <time.h>

#define ROUNDS 1000

static struct uprobe inner_probe, work_probe, next_probe;
static unsigned long inner_hits, work_hits, next_hits;
static int failures, rounds;
static pthread_t toggler;

static void count(struct uprobe *u, struct pt_regs *regs)
{
	(void)regs;
	__atomic_fetch_add(u == &inner_probe ? &inner_hits : u == &work_probe ? &work_hits : &next_hits, 1,
			   __ATOMIC_RELAXED);
}

static void pause_a_little(void)
{
	struct timespec t = { 0, 20000 };
	nanosleep(&t, NULL);
}

static void *toggle(void *arg)
{
	volatile int *started = (volatile int *)uprobe_lookup("started");
	volatile int *done = (volatile int *)uprobe_lookup("done");

	(void)arg;
	while (!*started)
		pause_a_little();
	for (rounds = 0; rounds < ROUNDS; rounds++) {
		unregister_uprobe(&work_probe);
		pause_a_little();
		failures += register_uprobe(&work_probe) != 0;
		failures += register_uprobe(&next_probe) != 0;
		pause_a_little();
		unregister_uprobe(&next_probe);
	}
	*done = 1;
	return NULL;
}

int uprobe_init(void)
{
	const char *next = uprobe_param("next");
	int rc;

	inner_probe.symbol_name = "inner";
	inner_probe.handler = count;
	work_probe.symbol_name = "work";
	work_probe.handler = count;
	next_probe.symbol_name = "work";
	next_probe.offset = next ? (unsigned long)(next[0] - '0') : 1;
	next_probe.handler = count;
	rc = register_uprobe(&inner_probe);
	if (rc == 0)
		rc = register_uprobe(&work_probe);
	if (rc == 0)
		rc = pthread_create(&toggler, NULL, toggle, NULL);
	return rc;
}

void uprobe_exit(void)
{
	pthread_join(toggler, NULL);
	unregister_uprobe(&inner_probe);
	unregister_uprobe(&work_probe);
	uprobe_printf("toggle: rounds=%d failures=%d inner=%lu work=%lu next=%lu\n", rounds, failures, inner_hits,
		      work_hits, next_hits);
}

/*
 * ppa-workload: the workload runner of the Linux guest image (images/linux/).
 *
 * The image's init passes it the value of `ppa.workload=` from the kernel command line. It
 * starts the workload's threads, named so that /proc (and so the guest agent) shows them, waits
 * for them, and prints what each measured on its own CPU clock (CLOCK_THREAD_CPUTIME_ID) as one
 * `PPA-THREAD key=value ...` line per thread and one `PPA-WORKLOAD ...` summary line.
 *
 *   spin:threads=N,ms=M
 *       N threads spin-0 .. spin-(N-1), each spinning until it has used M ms of CPU.
 *   periodic:threads=N,run_us=R,period_us=P,ms=M
 *       N threads periodic-0 .. periodic-(N-1), a packet loop: every P us (absolute
 *       CLOCK_MONOTONIC deadlines) each wakes, works R us of its own CPU time and sleeps
 *       again, for M ms of wall time. A period whose work ends past the next deadline is an
 *       overrun; the next deadline is then the first one still ahead.
 *   rt-spin:cpu=C,ms=M[,prio=P]
 *       one thread rt-spin-0, pinned to CPU C and at SCHED_FIFO priority P (default 50),
 *       spinning until it has used M ms of CPU: the CPU runs nothing else (the kernel's RT
 *       throttling aside: 50 ms a second by default) and never idles, so its vCPU stays in
 *       guest code without an exit, a runaway to the VMM (docs/limits.md).
 *
 *   udp-echo:..., udp-ping:... and mktap:...
 *       the network shapes, in udp.c.
 *   udp-blast:..., udp-sink:..., udp-trigger:..., udp-blaster:..., channels:... and
 *   virtio-rebind:...
 *       the load shapes (and two reconfigurations of a virtio-net device), in load.c.
 *
 * Exit codes: 0 done, 2 bad spec or a thread could not start.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define MAX_MS (3600ULL * 1000)
#define NS_PER_US 1000ULL
#define NS_PER_MS 1000000ULL

enum kind { SPIN, PERIODIC, RT_SPIN };

struct spec {
	enum kind kind;
	uint64_t threads, ms, run_us, period_us, cpu, prio;
};

struct worker {
	const struct spec *spec;
	pthread_barrier_t *start;
	unsigned index;
	char name[16];
	pid_t tid;
	int setup_error;
	uint64_t cpu_ns, wall_ns, periods, overruns, max_late_ns;
};

/* Pins the calling thread to CPU `cpu` at SCHED_FIFO priority `prio`; 0 or an errno. */
static int realtime(uint64_t cpu, uint64_t prio)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET((int)cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0)
		return errno;
	struct sched_param p = { .sched_priority = (int)prio };
	if (sched_setscheduler(0, SCHED_FIFO, &p) != 0)
		return errno;
	return 0;
}

static uint64_t now(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/*
 * Burns CPU until this thread's CPU clock reaches `until_ns`. The thread CPU clock is a system
 * call, so the loop reads it once per chunk and spins each chunk on CLOCK_MONOTONIC (the vDSO,
 * no kernel entry) for the CPU time still missing: a thread never runs longer than it waits, so
 * a chunk never overshoots, and a preempted one is followed by a shorter chunk. The thread thus
 * spends its time in user mode, as a real workload would.
 */
static void spin_until_cpu(uint64_t until_ns)
{
	volatile uint64_t sink = 0;
	for (;;) {
		uint64_t cpu = now(CLOCK_THREAD_CPUTIME_ID);
		if (cpu >= until_ns)
			return;
		uint64_t end = now(CLOCK_MONOTONIC) + (until_ns - cpu);
		while (now(CLOCK_MONOTONIC) < end)
			for (int i = 0; i < 64; i++)
				sink += (uint64_t)i * 2654435761ULL;
	}
}

static void *run_worker(void *arg)
{
	struct worker *w = arg;
	const struct spec *s = w->spec;

	/* prctl names the thread in /proc/<pid>/task/<tid>/comm, which the agent reads. */
	prctl(PR_SET_NAME, w->name, 0, 0, 0);
	w->tid = (pid_t)syscall(SYS_gettid);
	if (s->kind == RT_SPIN)
		w->setup_error = realtime(s->cpu, s->prio);
	pthread_barrier_wait(w->start);
	if (w->setup_error)
		return NULL;

	uint64_t cpu0 = now(CLOCK_THREAD_CPUTIME_ID);
	uint64_t wall0 = now(CLOCK_MONOTONIC);
	if (s->kind == SPIN || s->kind == RT_SPIN) {
		spin_until_cpu(cpu0 + s->ms * NS_PER_MS);
	} else {
		uint64_t period = s->period_us * NS_PER_US;
		uint64_t end = wall0 + s->ms * NS_PER_MS;
		uint64_t deadline = wall0;
		while (deadline < end) {
			struct timespec ts = { (time_t)(deadline / 1000000000ULL),
					       (long)(deadline % 1000000000ULL) };
			while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
				;
			uint64_t woke = now(CLOCK_MONOTONIC);
			if (woke > deadline && woke - deadline > w->max_late_ns)
				w->max_late_ns = woke - deadline;
			spin_until_cpu(now(CLOCK_THREAD_CPUTIME_ID) + s->run_us * NS_PER_US);
			w->periods++;
			uint64_t done = now(CLOCK_MONOTONIC);
			deadline += period;
			if (done > deadline) {
				w->overruns++;
				deadline += (done - deadline) / period * period + period;
			}
		}
	}
	w->cpu_ns = now(CLOCK_THREAD_CPUTIME_ID) - cpu0;
	w->wall_ns = now(CLOCK_MONOTONIC) - wall0;
	return NULL;
}

/* Parses `key=value` into *out when `item` names `key`; returns 1 on a match, -1 on a bad value. */
static int take(const char *item, const char *key, uint64_t *out)
{
	size_t n = strlen(key);
	if (strncmp(item, key, n) != 0 || item[n] != '=')
		return 0;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(item + n + 1, &end, 10);
	if (errno || end == item + n + 1 || *end != '\0')
		return -1;
	*out = v;
	return 1;
}

static int parse(const char *text, struct spec *s, char *err, size_t errlen)
{
	char buf[256];
	if (strlen(text) >= sizeof(buf)) {
		snprintf(err, errlen, "the workload spec is longer than %zu characters", sizeof(buf) - 1);
		return -1;
	}
	strcpy(buf, text);
	char *colon = strchr(buf, ':');
	char *params = colon ? colon + 1 : buf + strlen(buf);
	if (colon)
		*colon = '\0';
	memset(s, 0, sizeof(*s));
	s->threads = 1;
	if (strcmp(buf, "spin") == 0) {
		s->kind = SPIN;
		s->ms = 500;
	} else if (strcmp(buf, "periodic") == 0) {
		s->kind = PERIODIC;
		s->ms = 1000;
		s->run_us = 200;
		s->period_us = 1000;
	} else if (strcmp(buf, "rt-spin") == 0) {
		s->kind = RT_SPIN;
		s->ms = 1000;
		s->cpu = UINT64_MAX;
		s->prio = 50;
	} else {
		snprintf(err, errlen, "unknown workload kind '%s' (ppa-workload alone lists them)",
			 buf);
		return -1;
	}
	for (char *save = NULL, *item = strtok_r(params, ",", &save); item;
	     item = strtok_r(NULL, ",", &save)) {
		int r = s->kind == RT_SPIN ? 0 : take(item, "threads", &s->threads);
		if (!r)
			r = take(item, "ms", &s->ms);
		if (!r && s->kind == RT_SPIN)
			r = take(item, "cpu", &s->cpu);
		if (!r && s->kind == RT_SPIN)
			r = take(item, "prio", &s->prio);
		if (!r && s->kind == PERIODIC)
			r = take(item, "run_us", &s->run_us);
		if (!r && s->kind == PERIODIC)
			r = take(item, "period_us", &s->period_us);
		if (r == 0) {
			snprintf(err, errlen, "unknown parameter '%s' for a %s workload", item, buf);
			return -1;
		}
		if (r < 0) {
			snprintf(err, errlen, "parameter '%s' needs a decimal number", item);
			return -1;
		}
	}
	if (s->threads < 1 || s->threads > MAX_THREADS) {
		snprintf(err, errlen, "threads must be 1..%d, not %" PRIu64, MAX_THREADS, s->threads);
		return -1;
	}
	if (s->ms < 1 || s->ms > MAX_MS) {
		snprintf(err, errlen, "ms must be 1..%llu, not %" PRIu64, MAX_MS, s->ms);
		return -1;
	}
	if (s->kind == RT_SPIN && (s->cpu >= CPU_SETSIZE || s->prio < 1 || s->prio > 99)) {
		snprintf(err, errlen,
			 "rt-spin needs cpu=C (0..%d) and a prio of 1..99 (cpu=%" PRIu64
			 ", prio=%" PRIu64 ")",
			 CPU_SETSIZE - 1, s->cpu, s->prio);
		return -1;
	}
	if (s->kind == PERIODIC &&
	    (s->period_us < 1 || s->run_us > s->period_us || s->period_us > s->ms * 1000)) {
		snprintf(err, errlen,
			 "periodic needs 1 <= period_us <= ms*1000 and run_us <= period_us "
			 "(run_us=%" PRIu64 ", period_us=%" PRIu64 ", ms=%" PRIu64 ")",
			 s->run_us, s->period_us, s->ms);
		return -1;
	}
	return 0;
}

int udp_main(const char *spec);
int load_handles(const char *spec);
int load_main(const char *spec);

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2) {
		fprintf(stderr,
			"usage: ppa-workload SPEC, one of\n"
			"  spin:threads=N,ms=M\n"
			"  periodic:threads=N,run_us=R,period_us=P,ms=M\n"
			"  rt-spin:cpu=C,ms=M[,prio=P]\n"
			"  udp-echo:port=P,ms=M\n"
			"  udp-ping:to=IP,count=N,size=B[,port=P][,timeout_ms=T]\n"
			"  mktap:name=NAME,queues=N\n"
			"  udp-blast:to=IP,count=N,size=B[,port=P][,ms=M]\n"
			"  udp-sink:port=P,ms=M[,expect=N][,idle_ms=I]"
			"[,trigger=IP:TPORT,count=C,size=B]\n"
			"  udp-trigger:to=IP:TPORT,count=C,size=B,port=P[,ms=M]\n"
			"  udp-blaster:port=TPORT\n"
			"  channels:n=N[,dev=IFACE]\n"
			"  virtio-rebind:addr=IP/PREFIX[,dev=IFACE][,timeout_ms=T]\n");
		return 2;
	}
	/* The load shapes first: udp-blast and the others also start with "udp-". */
	if (load_handles(argv[1]))
		return load_main(argv[1]);
	if (strncmp(argv[1], "udp-", 4) == 0 || strncmp(argv[1], "mktap", 5) == 0)
		return udp_main(argv[1]);
	struct spec s;
	char err[256];
	if (parse(argv[1], &s, err, sizeof(err)) != 0) {
		fprintf(stderr, "ppa-workload: %s\n", err);
		return 2;
	}
	const char *kind = s.kind == SPIN ? "spin" : s.kind == RT_SPIN ? "rt-spin" : "periodic";
	struct worker *w = calloc(s.threads, sizeof(*w));
	pthread_t *t = calloc(s.threads, sizeof(*t));
	pthread_barrier_t start;
	if (!w || !t || pthread_barrier_init(&start, NULL, (unsigned)s.threads + 1) != 0) {
		fprintf(stderr, "ppa-workload: out of memory for %" PRIu64 " threads\n", s.threads);
		return 2;
	}
	printf("PPA-WORKLOAD-START spec=%s pid=%d\n", argv[1], (int)getpid());
	for (unsigned i = 0; i < s.threads; i++) {
		w[i].spec = &s;
		w[i].start = &start;
		w[i].index = i;
		snprintf(w[i].name, sizeof(w[i].name), "%s-%u", kind, i);
		int e = pthread_create(&t[i], NULL, run_worker, &w[i]);
		if (e != 0) {
			fprintf(stderr, "ppa-workload: cannot start thread %s: %s\n", w[i].name,
				strerror(e));
			return 2;
		}
	}
	uint64_t wall0 = now(CLOCK_MONOTONIC);
	pthread_barrier_wait(&start);
	uint64_t cpu_total = 0;
	int failed = 0;
	for (unsigned i = 0; i < s.threads; i++) {
		pthread_join(t[i], NULL);
		cpu_total += w[i].cpu_ns;
		if (w[i].setup_error) {
			fprintf(stderr,
				"ppa-workload: cannot pin %s to CPU %" PRIu64
				" at SCHED_FIFO %" PRIu64 ": %s\n",
				w[i].name, s.cpu, s.prio, strerror(w[i].setup_error));
			failed = 1;
		}
	}
	if (failed)
		return 2;
	uint64_t wall = now(CLOCK_MONOTONIC) - wall0;
	for (unsigned i = 0; i < s.threads; i++) {
		printf("PPA-THREAD name=%s tid=%d cpu_ns=%" PRIu64 " wall_ns=%" PRIu64, w[i].name,
		       (int)w[i].tid, w[i].cpu_ns, w[i].wall_ns);
		if (s.kind == PERIODIC)
			printf(" periods=%" PRIu64 " overruns=%" PRIu64 " max_late_ns=%" PRIu64,
			       w[i].periods, w[i].overruns, w[i].max_late_ns);
		printf("\n");
	}
	printf("PPA-WORKLOAD kind=%s threads=%" PRIu64 " cpu_ns=%" PRIu64 " wall_ns=%" PRIu64 "\n",
	       kind, s.threads, cpu_total, wall);
	return 0;
}

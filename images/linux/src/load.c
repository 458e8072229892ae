/*
 * The load shapes of ppa-workload (images/linux/): UDP workloads that drive a network path as
 * hard as the sockets take it, and two that reconfigure a virtio-net device under a running
 * guest. udp.c has the gentle ones (echo, ping); these are for loading Linux's virtio-net driver.
 *
 *   udp-blast:to=IP,count=N,size=B[,port=P][,ms=M]
 *       sends N datagrams of B bytes to IP:P (default port 9) as fast as the socket takes them,
 *       stopping early after M ms when M > 0; prints
 *       `PPA-UDP-BLAST to=IP port=P sent=N errors=N retries=N ms=T pps=X`.
 *   udp-sink:port=P,ms=M[,expect=N][,idle_ms=I][,trigger=IP:TPORT,count=C,size=B]
 *       counts the datagrams arriving on UDP port P until N came (default C with trigger=,
 *       else no limit), M ms passed, or none came for I ms (default 3000) after the first;
 *       M = 0 runs until SIGTERM/SIGINT (and then I only applies when given). With trigger=
 *       it first asks the udp-blaster at IP:TPORT to blast C datagrams of B bytes at port P.
 *       Prints `PPA-UDP-SINK port=P received=N bytes=N first_to_last_us=X ms=T`.
 *   udp-trigger:to=IP:TPORT,count=C,size=B,port=P[,ms=M]
 *       only sends that request (the blast limited to M ms, 0 = none), so that the next
 *       workload of a sequence runs while the peer blasts; prints
 *       `PPA-UDP-TRIGGER to=IP:TPORT count=C size=B port=P ms=M`.
 *   udp-blaster:port=TPORT
 *       the peer: until SIGTERM/SIGINT, answers each request arriving on TPORT, one at a time,
 *       with a blast to the requester's address at the port it names (a PPA-UDP-BLAST line
 *       each); then prints `PPA-UDP-BLASTER triggers=N blasts_sent=N malformed=N`.
 *   channels:n=N[,dev=eth0]
 *       sets DEV's combined channels (queue pairs) to N with ETHTOOL_SCHANNELS; prints
 *       `PPA-CHANNELS dev=DEV n=N max=M rc=E` (N as read back, M the driver's maximum).
 *   virtio-rebind:addr=IP/PREFIX[,dev=eth0][,timeout_ms=T]
 *       unbinds the virtio device behind DEV from virtio_net, binds it again, gives the new
 *       DEV the address and brings it up; prints
 *       `PPA-REBIND dev=DEV device=virtioN down_ms=X up_ms=Y rc=E`.
 *
 * The request a trigger sends (one datagram, strictly this text; anything else is counted as
 * malformed and ignored): `blast count=C size=B port=P ms=M`.
 *
 * Exit codes: 0 done (lost datagrams are reported, not failures), 2 bad spec, socket error or a
 * failed reconfiguration (with rc=errno in the result line and a sentence on stderr).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_COUNT 10000000ULL
#define MAX_SIZE 65000ULL
#define MAX_MS 3600000ULL
#define NS_PER_MS ((uint64_t)1000000)
/* A datagram the socket refuses (ENOBUFS) for this long counts as an error, not a retry. */
#define STUCK_NS (1000 * NS_PER_MS)
/* How long a daemon sleeps in poll() at most, so that a signal between its flag check and the
 * poll() is seen this late at worst. */
#define POLL_MS 200
/* The receive buffer the sink asks for: deep enough that the socket is not where a burst is
 * dropped, bounded because a guest of 512 MiB holds it. The kernel doubles it. */
#define SINK_RCVBUF (32 << 20)
#define SINK_BATCH 64

enum kind { BLAST, SINK, TRIGGER, BLASTER, CHANNELS, REBIND, KINDS };
static const char *const kind_names[KINDS] = { "udp-blast", "udp-sink", "udp-trigger",
					       "udp-blaster", "channels", "virtio-rebind" };

enum key { TO, COUNT, SIZE, PORT, MS, EXPECT, IDLE_MS, TRIGGER_AT, N, DEV, ADDR, TIMEOUT_MS, KEYS };
#define BIT(x) (1u << (x))

/* Each key of a spec: its name, whether its value is text, its range, and which kinds take it. */
static const struct {
	const char *name;
	int text;
	uint64_t min, max;
	unsigned kinds;
} keys[KEYS] = {
	[TO] = { "to", 1, 0, 0, BIT(BLAST) | BIT(TRIGGER) },
	[COUNT] = { "count", 0, 1, MAX_COUNT, BIT(BLAST) | BIT(SINK) | BIT(TRIGGER) },
	[SIZE] = { "size", 0, 1, MAX_SIZE, BIT(BLAST) | BIT(SINK) | BIT(TRIGGER) },
	[PORT] = { "port", 0, 1, 65535, BIT(BLAST) | BIT(SINK) | BIT(TRIGGER) | BIT(BLASTER) },
	[MS] = { "ms", 0, 0, MAX_MS, BIT(BLAST) | BIT(SINK) | BIT(TRIGGER) },
	[EXPECT] = { "expect", 0, 1, MAX_COUNT, BIT(SINK) },
	[IDLE_MS] = { "idle_ms", 0, 1, MAX_MS, BIT(SINK) },
	[TRIGGER_AT] = { "trigger", 1, 0, 0, BIT(SINK) },
	[N] = { "n", 0, 1, 1024, BIT(CHANNELS) },
	[DEV] = { "dev", 1, 0, 0, BIT(CHANNELS) | BIT(REBIND) },
	[ADDR] = { "addr", 1, 0, 0, BIT(REBIND) },
	[TIMEOUT_MS] = { "timeout_ms", 0, 1, 600000, BIT(REBIND) },
};

/* The keys each kind cannot do without. */
static const unsigned required[KINDS] = {
	[BLAST] = BIT(TO) | BIT(COUNT) | BIT(SIZE),
	[SINK] = BIT(PORT) | BIT(MS),
	[TRIGGER] = BIT(TO) | BIT(COUNT) | BIT(SIZE) | BIT(PORT),
	[BLASTER] = BIT(PORT),
	[CHANNELS] = BIT(N),
	[REBIND] = BIT(ADDR),
};

struct spec {
	enum kind kind;
	unsigned seen;
	uint64_t v[KEYS];
	char text[KEYS][64];
};

/* The outcome of one blast. */
struct blast {
	uint64_t sent, errors, retries, ns;
	int last_errno;
};

/* Set by SIGTERM/SIGINT; the daemons' loops look at it at least every POLL_MS. */
static volatile sig_atomic_t stopping;

static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

/* Without SA_RESTART, so that a blocking sendto() or poll() returns EINTR on the signal. */
static void catch_stop(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Strict decimal: digits only (at most 19, which cannot overflow), no sign, no spaces; *end is
 * left after them. */
static int decimal(const char *s, const char **end, uint64_t *out)
{
	const char *p = s;
	uint64_t v = 0;
	while (*p >= '0' && *p <= '9' && p - s < 20)
		v = v * 10 + (uint64_t)(*p++ - '0');
	if (p == s || p - s > 19)
		return -1;
	*out = v;
	*end = p;
	return 0;
}

/* `IP:PORT` into *a. */
static int ip_port(const char *text, struct sockaddr_in *a)
{
	char ip[64];
	const char *colon = strrchr(text, ':'), *end;
	uint64_t port;
	if (!colon || (size_t)(colon - text) >= sizeof(ip) || decimal(colon + 1, &end, &port) ||
	    *end || port < 1 || port > 65535)
		return -1;
	memcpy(ip, text, (size_t)(colon - text));
	ip[colon - text] = '\0';
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_port = htons((uint16_t)port);
	return inet_pton(AF_INET, ip, &a->sin_addr) == 1 ? 0 : -1;
}

/* `IP/PREFIX` into an address and its netmask. */
static int ip_prefix(const char *text, struct in_addr *ip, struct in_addr *mask)
{
	char buf[64];
	const char *slash = strchr(text, '/'), *end;
	uint64_t prefix;
	if (!slash || (size_t)(slash - text) >= sizeof(buf) || decimal(slash + 1, &end, &prefix) ||
	    *end || prefix > 32)
		return -1;
	memcpy(buf, text, (size_t)(slash - text));
	buf[slash - text] = '\0';
	mask->s_addr = htonl(prefix ? 0xffffffffU << (32 - prefix) : 0);
	return inet_pton(AF_INET, buf, ip) == 1 ? 0 : -1;
}

/* Splits `kind:k=v,...` into *s, refusing unknown keys, repeated keys, bad numbers and values
 * out of range with a sentence on stderr. */
static int parse(const char *text, struct spec *s)
{
	char buf[256];
	if (strlen(text) >= sizeof(buf)) {
		fprintf(stderr, "ppa-workload: the workload spec is longer than %zu characters\n",
			sizeof(buf) - 1);
		return -1;
	}
	strcpy(buf, text);
	char *colon = strchr(buf, ':');
	char *params = colon ? colon + 1 : buf + strlen(buf);
	if (colon)
		*colon = '\0';
	memset(s, 0, sizeof(*s));
	for (s->kind = 0; s->kind < KINDS && strcmp(buf, kind_names[s->kind]) != 0; s->kind++)
		;
	if (s->kind == KINDS) {
		fprintf(stderr, "ppa-workload: unknown workload kind '%s'\n", buf);
		return -1;
	}
	const char *kind = kind_names[s->kind];
	for (char *save = NULL, *item = strtok_r(params, ",", &save); item;
	     item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '=');
		enum key k = 0;
		if (eq)
			for (*eq = '\0'; k < KEYS && strcmp(item, keys[k].name) != 0; k++)
				;
		if (!eq || k == KEYS || !(keys[k].kinds & BIT(s->kind))) {
			if (eq)
				*eq = '=';
			fprintf(stderr, "ppa-workload: unknown parameter '%s' for %s\n", item, kind);
			return -1;
		}
		const char *value = eq + 1, *end;
		if (s->seen & BIT(k)) {
			fprintf(stderr, "ppa-workload: %s= is given twice for %s\n", item, kind);
			return -1;
		}
		s->seen |= BIT(k);
		if (keys[k].text) {
			if (!*value || strlen(value) >= sizeof(s->text[k])) {
				fprintf(stderr, "ppa-workload: %s= of %s needs a value of 1..%zu characters\n",
					item, kind, sizeof(s->text[k]) - 1);
				return -1;
			}
			strcpy(s->text[k], value);
		} else if (decimal(value, &end, &s->v[k]) || *end) {
			fprintf(stderr, "ppa-workload: %s= of %s needs a decimal number, not '%s'\n",
				item, kind, value);
			return -1;
		} else if (s->v[k] < keys[k].min || s->v[k] > keys[k].max) {
			fprintf(stderr,
				"ppa-workload: %s= of %s must be %" PRIu64 "..%" PRIu64 ", not %" PRIu64 "\n",
				item, kind, keys[k].min, keys[k].max, s->v[k]);
			return -1;
		}
	}
	unsigned missing = required[s->kind] & ~s->seen;
	if (s->kind == SINK && (s->seen & BIT(TRIGGER_AT)))
		missing |= (BIT(COUNT) | BIT(SIZE)) & ~s->seen;
	if (s->kind == SINK && !(s->seen & BIT(TRIGGER_AT)) && (s->seen & (BIT(COUNT) | BIT(SIZE)))) {
		fprintf(stderr, "ppa-workload: udp-sink takes count= and size= only with trigger=\n");
		return -1;
	}
	for (enum key k = 0; k < KEYS; k++)
		if (missing & BIT(k)) {
			fprintf(stderr, "ppa-workload: %s needs %s=\n", kind, keys[k].name);
			return -1;
		}
	/* The text values, each checked for what it must be. */
	struct sockaddr_in a;
	struct in_addr ip, mask;
	if (s->kind == BLAST && inet_pton(AF_INET, s->text[TO], &ip) != 1) {
		fprintf(stderr, "ppa-workload: to= of udp-blast must be an IPv4 address, not '%s'\n",
			s->text[TO]);
		return -1;
	}
	if (s->kind == TRIGGER && ip_port(s->text[TO], &a)) {
		fprintf(stderr, "ppa-workload: to= of udp-trigger must be IPv4:PORT, not '%s'\n",
			s->text[TO]);
		return -1;
	}
	if ((s->seen & BIT(TRIGGER_AT)) && ip_port(s->text[TRIGGER_AT], &a)) {
		fprintf(stderr, "ppa-workload: trigger= of udp-sink must be IPv4:PORT, not '%s'\n",
			s->text[TRIGGER_AT]);
		return -1;
	}
	if (s->kind == REBIND && ip_prefix(s->text[ADDR], &ip, &mask)) {
		fprintf(stderr, "ppa-workload: addr= of virtio-rebind must be IPv4/PREFIX, not '%s'\n",
			s->text[ADDR]);
		return -1;
	}
	if (!(s->seen & BIT(DEV)))
		strcpy(s->text[DEV], "eth0");
	if (strlen(s->text[DEV]) >= IFNAMSIZ || strchr(s->text[DEV], '/') ||
	    strcmp(s->text[DEV], ".") == 0 || strcmp(s->text[DEV], "..") == 0) {
		fprintf(stderr, "ppa-workload: '%s' is not a network interface name\n", s->text[DEV]);
		return -1;
	}
	if (!(s->seen & BIT(PORT)) && s->kind == BLAST)
		s->v[PORT] = 9;
	if (!(s->seen & BIT(TIMEOUT_MS)))
		s->v[TIMEOUT_MS] = 10000;
	return 0;
}

/* A UDP socket, bound to `port` unless it is 0; -1 with a sentence on stderr when it fails. */
static int udp_socket(uint16_t port)
{
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		fprintf(stderr, "ppa-workload: socket: %s\n", strerror(errno));
		return -1;
	}
	if (port) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
		if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
			fprintf(stderr, "ppa-workload: bind port %u: %s\n", port, strerror(errno));
			close(fd);
			return -1;
		}
	}
	return fd;
}

/*
 * Sends `count` datagrams of `size` bytes to `dst` as fast as the socket takes them: a blocking
 * sendto() each, so a full send buffer paces the loop. The socket has IP_RECVERR: without it the
 * kernel hides a qdisc or device queue drop (ENOBUFS) and counts the datagram as sent; with it
 * the drop comes back, and the datagram is sent again after a sched_yield() (a retry). A
 * datagram refused that way for STUCK_NS, or with any other error (ECONNREFUSED after an ICMP
 * port unreachable, for one), is an error and the blast goes on with the next. Each datagram of
 * 8 bytes or more carries its sequence number, big-endian, in its first 8 bytes. Ends early
 * after `ms` ms when `ms` > 0, or on SIGTERM/SIGINT where catch_stop() was called.
 */
static void blast(int fd, const struct sockaddr_in *dst, uint64_t count, uint64_t size,
		  uint64_t ms, struct blast *b)
{
	static unsigned char buf[MAX_SIZE];
	memset(buf, 0x5a, size);
	memset(b, 0, sizeof(*b));
	uint64_t t0 = mono_ns(), end = ms ? t0 + ms * NS_PER_MS : UINT64_MAX;
	for (uint64_t seq = 0; seq < count && !stopping && (!ms || mono_ns() < end); seq++) {
		if (size >= 8) {
			uint64_t be = htobe64(seq);
			memcpy(buf, &be, sizeof(be));
		}
		for (uint64_t first_refusal = 0;;) {
			ssize_t n = sendto(fd, buf, size, 0, (const struct sockaddr *)dst, sizeof(*dst));
			if (n == (ssize_t)size) {
				b->sent++;
				break;
			}
			int e = n < 0 ? errno : EMSGSIZE;
			if (stopping)
				goto out;
			if (e == EINTR)
				continue;
			if (e == ENOBUFS || e == EAGAIN || e == EWOULDBLOCK) {
				uint64_t now = mono_ns();
				if (now >= end)
					goto out;
				if (!first_refusal)
					first_refusal = now;
				if (now - first_refusal < STUCK_NS) {
					b->retries++;
					sched_yield();
					continue;
				}
			}
			b->errors++;
			b->last_errno = e;
			break;
		}
	}
out:
	b->ns = mono_ns() - t0;
}

/* Opens the sending socket of a blast (see blast() for IP_RECVERR). */
static int blast_socket(void)
{
	int fd = udp_socket(0), on = 1;
	if (fd >= 0 && setsockopt(fd, IPPROTO_IP, IP_RECVERR, &on, sizeof(on)) != 0) {
		fprintf(stderr, "ppa-workload: IP_RECVERR: %s\n", strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

static void print_blast(const struct sockaddr_in *dst, const struct blast *b)
{
	char ip[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &dst->sin_addr, ip, sizeof(ip));
	uint64_t pps = b->ns ? b->sent * 1000000000ULL / b->ns : 0;
	printf("PPA-UDP-BLAST to=%s port=%u sent=%" PRIu64 " errors=%" PRIu64 " retries=%" PRIu64
	       " ms=%" PRIu64 " pps=%" PRIu64 "\n",
	       ip, ntohs(dst->sin_port), b->sent, b->errors, b->retries, b->ns / NS_PER_MS, pps);
	if (b->errors)
		fprintf(stderr, "ppa-workload: %" PRIu64 " datagrams to %s:%u were not sent, the last: %s\n",
			b->errors, ip, ntohs(dst->sin_port), strerror(b->last_errno));
}

static int udp_blast(const struct spec *s)
{
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s->v[PORT]) };
	inet_pton(AF_INET, s->text[TO], &dst.sin_addr);
	int fd = blast_socket();
	if (fd < 0)
		return 2;
	catch_stop(); /* a blast ended by a signal still prints what it sent */
	struct blast b;
	blast(fd, &dst, s->v[COUNT], s->v[SIZE], s->v[MS], &b);
	print_blast(&dst, &b);
	close(fd);
	return 0;
}

/* Sends the request `blast count=C size=B port=P ms=M` to `to` (IP:TPORT) from `fd`. */
static int send_trigger(int fd, const char *to, uint64_t count, uint64_t size, uint64_t port,
			uint64_t ms)
{
	struct sockaddr_in dst;
	char msg[128];
	ip_port(to, &dst);
	int n = snprintf(msg, sizeof(msg),
			 "blast count=%" PRIu64 " size=%" PRIu64 " port=%" PRIu64 " ms=%" PRIu64,
			 count, size, port, ms);
	if (sendto(fd, msg, (size_t)n, 0, (struct sockaddr *)&dst, sizeof(dst)) != n) {
		fprintf(stderr, "ppa-workload: cannot send the trigger to %s: %s\n", to,
			strerror(errno));
		return -1;
	}
	return 0;
}

static int udp_trigger(const struct spec *s)
{
	int fd = udp_socket(0);
	if (fd < 0 || send_trigger(fd, s->text[TO], s->v[COUNT], s->v[SIZE], s->v[PORT], s->v[MS]))
		return 2;
	printf("PPA-UDP-TRIGGER to=%s count=%" PRIu64 " size=%" PRIu64 " port=%" PRIu64
	       " ms=%" PRIu64 "\n",
	       s->text[TO], s->v[COUNT], s->v[SIZE], s->v[PORT], s->v[MS]);
	close(fd);
	return 0;
}

/*
 * The receiving side. It reads in batches (recvmmsg, 64 datagrams a call) so that the sink
 * itself is seldom what falls behind, and with MSG_TRUNC, which makes each length the
 * datagram's own even though only its first bytes are copied.
 */
static int udp_sink(const struct spec *s)
{
	uint16_t port = (uint16_t)s->v[PORT];
	uint64_t ms = s->v[MS];
	int fd = udp_socket(port), want = SINK_RCVBUF;
	if (fd < 0)
		return 2;
	/* SO_RCVBUFFORCE passes over net.core.rmem_max (root has CAP_NET_ADMIN); else the
	 * kernel caps SO_RCVBUF at rmem_max: as large as allowed either way. */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &want, sizeof(want)) != 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &want, sizeof(want));
	catch_stop();
	uint64_t t0 = mono_ns();
	int triggered = (s->seen & BIT(TRIGGER_AT)) != 0;
	if (triggered && send_trigger(fd, s->text[TRIGGER_AT], s->v[COUNT], s->v[SIZE], port, ms)) {
		close(fd);
		return 2;
	}
	uint64_t expect = s->seen & BIT(EXPECT) ? s->v[EXPECT] : triggered ? s->v[COUNT] : 0;
	/* The idle limit: as given, else 3 s, but none for a daemon (ms=0) unless given. */
	uint64_t idle_ns = ms ? 3000 * NS_PER_MS : 0;
	if (s->seen & BIT(IDLE_MS))
		idle_ns = s->v[IDLE_MS] * NS_PER_MS;
	uint64_t end = ms ? t0 + ms * NS_PER_MS : UINT64_MAX;
	uint64_t received = 0, bytes = 0, first = 0, last = 0;
	static char bufs[SINK_BATCH][64];
	struct iovec iov[SINK_BATCH];
	struct mmsghdr msgs[SINK_BATCH];
	memset(msgs, 0, sizeof(msgs));
	for (int i = 0; i < SINK_BATCH; i++) {
		iov[i] = (struct iovec){ .iov_base = bufs[i], .iov_len = sizeof(bufs[i]) };
		msgs[i].msg_hdr.msg_iov = &iov[i];
		msgs[i].msg_hdr.msg_iovlen = 1;
	}
	printf("PPA-UDP-SINK-START port=%u\n", port);
	while (!stopping && (!expect || received < expect)) {
		uint64_t now = mono_ns(), wait = POLL_MS * NS_PER_MS;
		if (now >= end || (received && idle_ns && now - last >= idle_ns))
			break;
		if (end - now < wait)
			wait = end - now;
		if (received && idle_ns && last + idle_ns - now < wait)
			wait = last + idle_ns - now;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, (int)((wait + NS_PER_MS - 1) / NS_PER_MS)) <= 0)
			continue;
		for (;;) {
			int n = recvmmsg(fd, msgs, SINK_BATCH, MSG_DONTWAIT | MSG_TRUNC, NULL);
			if (n <= 0)
				break;
			last = mono_ns();
			if (!received)
				first = last;
			received += (uint64_t)n;
			for (int i = 0; i < n; i++)
				bytes += msgs[i].msg_len;
			if (n < SINK_BATCH || (expect && received >= expect))
				break;
		}
	}
	printf("PPA-UDP-SINK port=%u received=%" PRIu64 " bytes=%" PRIu64
	       " first_to_last_us=%" PRIu64 " ms=%" PRIu64 "\n",
	       port, received, bytes, (last - first) / 1000, (mono_ns() - t0) / NS_PER_MS);
	close(fd);
	return 0;
}

/* Reads a request `blast count=C size=B port=P ms=M` (exactly that) into v[0..3]. */
static int parse_request(char *msg, size_t len, uint64_t v[4])
{
	static const char *const words[4] = { "blast count=", " size=", " port=", " ms=" };
	static const uint64_t min[4] = { 1, 1, 1, 0 }, max[4] = { MAX_COUNT, MAX_SIZE, 65535, MAX_MS };
	if (len == 0 || len >= 128 || memchr(msg, '\0', len))
		return -1;
	msg[len] = '\0';
	const char *p = msg;
	for (int i = 0; i < 4; i++) {
		size_t n = strlen(words[i]);
		if (strncmp(p, words[i], n) != 0 || decimal(p + n, &p, &v[i]) || v[i] < min[i] ||
		    v[i] > max[i])
			return -1;
	}
	return *p ? -1 : 0;
}

static int udp_blaster(const struct spec *s)
{
	uint16_t port = (uint16_t)s->v[PORT];
	int fd = udp_socket(port), out = fd < 0 ? -1 : blast_socket();
	if (out < 0)
		return 2;
	catch_stop();
	uint64_t triggers = 0, blasts_sent = 0, malformed = 0;
	static char msg[256];
	printf("PPA-UDP-BLASTER-START port=%u\n", port);
	while (!stopping) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, POLL_MS) <= 0)
			continue;
		struct sockaddr_in from;
		socklen_t fl = sizeof(from);
		ssize_t n = recvfrom(fd, msg, sizeof(msg) - 1, MSG_DONTWAIT, (struct sockaddr *)&from,
				     &fl);
		if (n < 0)
			continue;
		uint64_t v[4];
		char ip[INET_ADDRSTRLEN];
		inet_ntop(AF_INET, &from.sin_addr, ip, sizeof(ip));
		if (parse_request(msg, (size_t)n, v)) {
			malformed++;
			fprintf(stderr, "ppa-workload: ignored a malformed trigger of %zd bytes from %s\n",
				n, ip);
			continue;
		}
		triggers++;
		from.sin_port = htons((uint16_t)v[2]);
		struct blast b;
		blast(out, &from, v[0], v[1], v[3], &b);
		blasts_sent += b.sent;
		print_blast(&from, &b);
	}
	printf("PPA-UDP-BLASTER triggers=%" PRIu64 " blasts_sent=%" PRIu64 " malformed=%" PRIu64 "\n",
	       triggers, blasts_sent, malformed);
	close(out);
	close(fd);
	return 0;
}

/* SIOCETHTOOL on `dev` with `data` (an ethtool command structure); 0 or the errno. */
static int ethtool(int fd, const char *dev, void *data)
{
	struct ifreq ifr;
	memset(&ifr, 0, sizeof(ifr));
	strcpy(ifr.ifr_name, dev);
	ifr.ifr_data = data;
	return ioctl(fd, SIOCETHTOOL, &ifr) == 0 ? 0 : errno;
}

static int channels(const struct spec *s)
{
	const char *dev = s->text[DEV];
	uint64_t n = s->v[N];
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		fprintf(stderr, "ppa-workload: socket: %s\n", strerror(errno));
		return 2;
	}
	struct ethtool_channels ch = { .cmd = ETHTOOL_GCHANNELS };
	int rc = ethtool(fd, dev, &ch);
	if (rc) {
		fprintf(stderr, "ppa-workload: cannot read the channels of %s (ETHTOOL_GCHANNELS): %s\n",
			dev, strerror(rc));
	} else if (n > ch.max_combined) {
		rc = EINVAL;
		fprintf(stderr, "ppa-workload: %s has at most %u combined channels, not %" PRIu64 "\n",
			dev, ch.max_combined, n);
	} else {
		/* rx, tx and other stay as read: virtio-net has only combined ones. */
		ch.cmd = ETHTOOL_SCHANNELS;
		ch.combined_count = (uint32_t)n;
		rc = ethtool(fd, dev, &ch);
		if (rc)
			fprintf(stderr,
				"ppa-workload: cannot set %s to %" PRIu64 " combined channels "
				"(ETHTOOL_SCHANNELS): %s\n",
				dev, n, strerror(rc));
		/* What the driver has now, whichever way it went. */
		ch.cmd = ETHTOOL_GCHANNELS;
		ethtool(fd, dev, &ch);
	}
	printf("PPA-CHANNELS dev=%s n=%u max=%u rc=%d\n", dev, ch.combined_count, ch.max_combined,
	       rc);
	close(fd);
	return rc ? 2 : 0;
}

static int exists(const char *dev)
{
	char path[64];
	struct stat st;
	snprintf(path, sizeof(path), "/sys/class/net/%s", dev);
	return stat(path, &st) == 0;
}

/* Waits until DEV exists (`want` 1) or is gone (0), up to `deadline`; 0 or ETIMEDOUT. */
static int wait_dev(const char *dev, int want, uint64_t deadline)
{
	while (exists(dev) != want) {
		if (mono_ns() >= deadline)
			return ETIMEDOUT;
		usleep(1000);
	}
	return 0;
}

/* Writes `text` to the sysfs file `path`; 0 or the errno. */
static int write_sysfs(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return errno;
	int rc = write(fd, text, strlen(text)) == (ssize_t)strlen(text) ? 0 : errno;
	close(fd);
	return rc;
}

/* Gives DEV the address and netmask and sets it up, as `ip addr add; ip link set up` would. */
static int configure(const char *dev, struct in_addr ip, struct in_addr mask)
{
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return errno;
	struct ifreq ifr;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr = ip };
	memset(&ifr, 0, sizeof(ifr));
	strcpy(ifr.ifr_name, dev);
	memcpy(&ifr.ifr_addr, &a, sizeof(a));
	int rc = ioctl(fd, SIOCSIFADDR, &ifr) == 0 ? 0 : errno;
	a.sin_addr = mask;
	memcpy(&ifr.ifr_netmask, &a, sizeof(a));
	if (!rc && ioctl(fd, SIOCSIFNETMASK, &ifr) != 0)
		rc = errno;
	if (!rc && ioctl(fd, SIOCGIFFLAGS, &ifr) != 0)
		rc = errno;
	ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
	if (!rc && ioctl(fd, SIOCSIFFLAGS, &ifr) != 0)
		rc = errno;
	close(fd);
	return rc;
}

/*
 * Unbinds the virtio device behind DEV from virtio_net and binds it again: the driver's remove
 * and probe paths, with the device's queues torn down and set up anew, under whatever traffic
 * the peer keeps sending. down_ms: from the unbind until DEV is gone; up_ms: from the bind
 * until DEV is back, addressed and up.
 */
static int virtio_rebind(const struct spec *s)
{
	const char *dev = s->text[DEV];
	static const char drv[] = "/sys/bus/virtio/drivers/virtio_net";
	char path[128], link[256], driver[256];
	struct in_addr ip, mask;
	ip_prefix(s->text[ADDR], &ip, &mask);
	snprintf(path, sizeof(path), "/sys/class/net/%s/device", dev);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	if (n < 0) {
		fprintf(stderr,
			"ppa-workload: %s has no device behind it (%s: %s); virtio-rebind needs "
			"a virtio-net interface\n",
			dev, path, strerror(errno));
		return 2;
	}
	link[n] = '\0';
	const char *device = strrchr(link, '/') ? strrchr(link, '/') + 1 : link;
	snprintf(path, sizeof(path), "/sys/class/net/%s/device/driver", dev);
	n = readlink(path, driver, sizeof(driver) - 1);
	driver[n < 0 ? 0 : n] = '\0';
	const char *name = strrchr(driver, '/') ? strrchr(driver, '/') + 1 : driver;
	if (strncmp(device, "virtio", 6) != 0 || strcmp(name, "virtio_net") != 0) {
		fprintf(stderr,
			"ppa-workload: %s is %s, bound to '%s', not a virtio device bound to "
			"virtio_net\n",
			dev, device, name);
		return 2;
	}
	uint64_t timeout_ns = s->v[TIMEOUT_MS] * NS_PER_MS, t0 = mono_ns(), down = 0, up = 0;
	const char *step = "unbind";
	snprintf(path, sizeof(path), "%s/unbind", drv);
	int rc = write_sysfs(path, device);
	if (!rc) {
		step = "wait for the interface to go";
		rc = wait_dev(dev, 0, t0 + timeout_ns);
	}
	down = mono_ns() - t0;
	uint64_t t1 = mono_ns();
	if (!rc) {
		step = "bind";
		snprintf(path, sizeof(path), "%s/bind", drv);
		rc = write_sysfs(path, device);
	}
	if (!rc) {
		step = "wait for the interface to come back";
		rc = wait_dev(dev, 1, t1 + timeout_ns);
	}
	if (!rc) {
		step = "configure the interface";
		rc = configure(dev, ip, mask);
	}
	up = rc ? 0 : mono_ns() - t1;
	if (rc)
		fprintf(stderr, "ppa-workload: virtio-rebind of %s (%s) failed to %s: %s\n", dev,
			device, step, strerror(rc));
	printf("PPA-REBIND dev=%s device=%s down_ms=%" PRIu64 " up_ms=%" PRIu64 " rc=%d\n", dev,
	       device, down / NS_PER_MS, up / NS_PER_MS, rc);
	return rc ? 2 : 0;
}

/* Whether `text` names one of this file's workload kinds (the part before ':'). */
int load_handles(const char *text)
{
	size_t len = strcspn(text, ":");
	for (int k = 0; k < KINDS; k++)
		if (strlen(kind_names[k]) == len && strncmp(text, kind_names[k], len) == 0)
			return 1;
	return 0;
}

/* Runs one of this file's workloads; returns the exit code. */
int load_main(const char *text)
{
	struct spec s;
	if (parse(text, &s))
		return 2;
	switch (s.kind) {
	case BLAST:
		return udp_blast(&s);
	case SINK:
		return udp_sink(&s);
	case TRIGGER:
		return udp_trigger(&s);
	case BLASTER:
		return udp_blaster(&s);
	case CHANNELS:
		return channels(&s);
	case REBIND:
		return virtio_rebind(&s);
	default:
		return 2;
	}
}

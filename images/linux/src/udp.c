/*
 * The network shapes of ppa-workload (images/linux/): a UDP reflector and a UDP pinger, the
 * two halves of a network function's simplest traffic.
 *
 *   udp-echo:port=P,ms=M
 *       answers every datagram that arrives on UDP port P with the same bytes, for M ms;
 *       prints `PPA-UDP-ECHO port=P received=N answered=N`.
 *   udp-ping:to=IP,count=N,size=B[,port=P][,timeout_ms=T]
 *       sends N datagrams of B bytes to IP:P (default port 7, the echo service), one at a
 *       time, each waiting up to T ms (default 1000) for its answer; prints
 *       `PPA-UDP-PING to=IP sent=N received=N lost=N p50_us=X p99_us=Y max_us=Z`
 *       (round trips of the answered ones, from CLOCK_MONOTONIC).
 *
 *   mktap:name=NAME,queues=N
 *       makes the persistent tap NAME (with IFF_MULTI_QUEUE when N > 1), for a nested test host
 *       whose busybox `tunctl` cannot make a multi-queue one; prints `PPA-MKTAP name=NAME`.
 *
 * The load shapes (udp-blast, udp-sink, udp-trigger, udp-blaster) and the virtio-net
 * reconfigurations (channels, virtio-rebind) are in load.c.
 *
 * Exit codes: 0 done (lost datagrams are reported, not failures), 2 bad spec or socket error.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sys/ioctl.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_COUNT 10000000ULL
#define MAX_SIZE 65000ULL

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* `key=value` of a decimal number into *out: 1 on a match, -1 on a bad value, 0 otherwise. */
static int num(const char *item, const char *key, uint64_t *out)
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

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

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

static int echo(uint64_t port, uint64_t ms)
{
	int fd = udp_socket((uint16_t)port);
	if (fd < 0)
		return 2;
	static char buf[65536];
	uint64_t end = mono_ns() + ms * 1000000ULL, received = 0, answered = 0;
	printf("PPA-UDP-ECHO-START port=%" PRIu64 "\n", port);
	for (uint64_t now = mono_ns(); now < end; now = mono_ns()) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left_ms = (int)((end - now) / 1000000ULL) + 1;
		if (poll(&p, 1, left_ms) <= 0)
			continue;
		struct sockaddr_in from;
		socklen_t fl = sizeof(from);
		ssize_t n = recvfrom(fd, buf, sizeof(buf), 0, (struct sockaddr *)&from, &fl);
		if (n < 0)
			continue;
		received++;
		if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, fl) == n)
			answered++;
	}
	printf("PPA-UDP-ECHO port=%" PRIu64 " received=%" PRIu64 " answered=%" PRIu64 "\n", port,
	       received, answered);
	close(fd);
	return 0;
}

static int ping(const char *to, uint64_t port, uint64_t count, uint64_t size, uint64_t timeout_ms)
{
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (inet_pton(AF_INET, to, &dst.sin_addr) != 1) {
		fprintf(stderr, "ppa-workload: '%s' is not an IPv4 address\n", to);
		return 2;
	}
	int fd = udp_socket(0);
	if (fd < 0)
		return 2;
	static char out[65536], in[65536];
	uint64_t *rtt = calloc(count ? count : 1, sizeof(uint64_t));
	if (!rtt) {
		fprintf(stderr, "ppa-workload: out of memory for %" PRIu64 " round trips\n", count);
		return 2;
	}
	uint64_t sent = 0, received = 0;
	for (uint64_t seq = 0; seq < count; seq++) {
		memset(out, 0x5a, size);
		memcpy(out, &seq, size < sizeof(seq) ? size : sizeof(seq));
		uint64_t t0 = mono_ns();
		if (sendto(fd, out, size, 0, (struct sockaddr *)&dst, sizeof(dst)) != (ssize_t)size)
			continue;
		sent++;
		uint64_t deadline = t0 + timeout_ms * 1000000ULL;
		for (uint64_t now = t0; now < deadline; now = mono_ns()) {
			struct pollfd p = { .fd = fd, .events = POLLIN };
			if (poll(&p, 1, (int)((deadline - now) / 1000000ULL) + 1) <= 0)
				continue;
			ssize_t n = recv(fd, in, sizeof(in), 0);
			uint64_t got = 0;
			if (n >= (ssize_t)sizeof(got))
				memcpy(&got, in, sizeof(got));
			if (n == (ssize_t)size && (size < sizeof(seq) || got == seq)) {
				rtt[received++] = mono_ns() - t0;
				break;
			}
		}
	}
	qsort(rtt, received, sizeof(uint64_t), cmp_u64);
	uint64_t p50 = received ? rtt[received / 2] / 1000 : 0;
	uint64_t p99 = received ? rtt[(received * 99) / 100 < received ? (received * 99) / 100 : received - 1] / 1000 : 0;
	uint64_t max = received ? rtt[received - 1] / 1000 : 0;
	printf("PPA-UDP-PING to=%s sent=%" PRIu64 " received=%" PRIu64 " lost=%" PRIu64
	       " p50_us=%" PRIu64 " p99_us=%" PRIu64 " max_us=%" PRIu64 "\n",
	       to, sent, received, sent - received, p50, p99, max);
	free(rtt);
	close(fd);
	return 0;
}

static int mktap(const char *name, uint64_t queues)
{
	struct ifreq ifr;
	memset(&ifr, 0, sizeof(ifr));
	if (strlen(name) >= IFNAMSIZ) {
		fprintf(stderr, "ppa-workload: tap name '%s' too long\n", name);
		return 2;
	}
	strcpy(ifr.ifr_name, name);
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | (queues > 1 ? IFF_MULTI_QUEUE : 0);
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
	if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) < 0 || ioctl(fd, TUNSETPERSIST, 1) < 0) {
		fprintf(stderr, "ppa-workload: cannot make the tap %s: %s\n", name, strerror(errno));
		return 2;
	}
	close(fd);
	printf("PPA-MKTAP name=%s queues=%" PRIu64 "\n", name, queues);
	return 0;
}

/* Runs `udp-echo:...`, `udp-ping:...` or `mktap:...`; returns the exit code. */
int udp_main(const char *text)
{
	char buf[256], to[64] = "";
	if (strlen(text) >= sizeof(buf)) {
		fprintf(stderr, "ppa-workload: the workload spec is too long\n");
		return 2;
	}
	strcpy(buf, text);
	char *colon = strchr(buf, ':');
	char *params = colon ? colon + 1 : buf + strlen(buf);
	if (colon)
		*colon = '\0';
	int is_ping = strcmp(buf, "udp-ping") == 0;
	if (!is_ping && strcmp(buf, "udp-echo") != 0 && strcmp(buf, "mktap") != 0) {
		fprintf(stderr, "ppa-workload: unknown workload kind '%s'\n", buf);
		return 2;
	}
	if (strcmp(buf, "mktap") == 0) {
		char name[IFNAMSIZ + 1] = "";
		uint64_t queues = 1;
		for (char *save = NULL, *item = strtok_r(params, ",", &save); item;
		     item = strtok_r(NULL, ",", &save)) {
			int r = num(item, "queues", &queues);
			if (!r && strncmp(item, "name=", 5) == 0 && strlen(item + 5) < sizeof(name)) {
				strcpy(name, item + 5);
				r = 1;
			}
			if (r <= 0) {
				fprintf(stderr, "ppa-workload: bad parameter '%s' for mktap\n", item);
				return 2;
			}
		}
		if (!name[0] || queues < 1 || queues > 16) {
			fprintf(stderr, "ppa-workload: mktap needs name= and 1..16 queues\n");
			return 2;
		}
		return mktap(name, queues);
	}
	uint64_t port = 7, ms = 10000, count = 100, size = 64, timeout_ms = 1000;
	for (char *save = NULL, *item = strtok_r(params, ",", &save); item;
	     item = strtok_r(NULL, ",", &save)) {
		int r = num(item, "port", &port);
		if (!r && !is_ping)
			r = num(item, "ms", &ms);
		if (!r && is_ping)
			r = num(item, "count", &count);
		if (!r && is_ping)
			r = num(item, "size", &size);
		if (!r && is_ping)
			r = num(item, "timeout_ms", &timeout_ms);
		if (!r && is_ping && strncmp(item, "to=", 3) == 0 && strlen(item + 3) < sizeof(to)) {
			strcpy(to, item + 3);
			r = 1;
		}
		if (r <= 0) {
			fprintf(stderr, "ppa-workload: bad parameter '%s' for %s\n", item, buf);
			return 2;
		}
	}
	if (port < 1 || port > 65535 || ms > 3600000ULL || count > MAX_COUNT || size < 1 ||
	    size > MAX_SIZE || timeout_ms < 1 || timeout_ms > 60000) {
		fprintf(stderr, "ppa-workload: %s parameters out of range\n", buf);
		return 2;
	}
	if (is_ping) {
		if (!to[0]) {
			fprintf(stderr, "ppa-workload: udp-ping needs to=IP\n");
			return 2;
		}
		return ping(to, port, count, size, timeout_ms);
	}
	return echo(port, ms);
}

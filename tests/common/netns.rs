//! A network namespace of the test's own with a tap in it, so that no test frame can leave
//! this machine: the VMM runs inside it (`ip netns exec`), and the test's own packet socket
//! is opened from a thread that joined it (`setns` changes only the calling thread).

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// Runs `ip ARGS`, panicking with its stderr when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A namespace `ppa-t-PID-N` with one tap, `tap0`, up, IPv6 off (no router solicitations or
/// address probes of its own on the tap: every frame on it is the test's). Removed on drop.
pub struct NetNs {
    /// The namespace's name.
    pub name: String,
    /// The tap's name.
    pub tap: String,
}

impl NetNs {
    /// A namespace with a tap made with `vnet_hdr` (and `multi_queue` when `mq`).
    pub fn new(mq: bool) -> NetNs {
        let name = format!(
            "ppa-t-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        ip(&["netns", "add", &name]);
        let ns = NetNs {
            name,
            tap: "tap0".into(),
        };
        let mut add = vec![
            "-n", &ns.name, "tuntap", "add", "dev", "tap0", "mode", "tap", "vnet_hdr",
        ];
        if mq {
            add.push("multi_queue");
        }
        ip(&add);
        let sysctl = Command::new("ip")
            .args(["netns", "exec", &ns.name, "sysctl", "-qw"])
            .args([
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ])
            .status()
            .expect("sysctl runs");
        assert!(sysctl.success());
        ip(&["-n", &ns.name, "link", "set", "tap0", "up"]);
        ns
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// One of the tap's counters (`rx_packets`, `tx_packets`, `tx_dropped`, …).
    pub fn tap_counter(&self, name: &str) -> u64 {
        let out = self
            .command("cat")
            .arg(format!("/sys/class/net/{}/statistics/{name}", self.tap))
            .output()
            .expect("cat runs");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {}", String::from_utf8_lossy(&out.stderr)))
    }

    /// Removes the tap (a tap that goes away under a running VM).
    pub fn delete_tap(&self) {
        ip(&["-n", &self.name, "link", "del", &self.tap]);
    }

    /// Runs `f` on a thread that has joined the namespace.
    pub fn within<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("the namespace's file");
            // SAFETY: setns takes a descriptor we hold and a flag; it changes only the
            // namespaces of this thread, which ends after `f`.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("the thread in the namespace")
    }

    /// Sends `count` 64-byte test frames into the namespace's tap from inside it, never more
    /// than `ahead` frames ahead of what `net0`'s first receive queue delivered (asked over the
    /// control socket `sock` only at that bound): the tap holds 1000 frames before it drops,
    /// so with `ahead` below that every frame gets to the VMM however fast or slow the host or
    /// the device is. Returns the frames sent.
    pub fn send_paced(&self, sock: std::path::PathBuf, count: u64, ahead: u64) -> u64 {
        let tap = self.tap.clone();
        self.within(move || {
            let s = PacketSocket::open(&tap, 100).expect("a packet socket on the tap");
            let mut c = super::vmm::Conn::new(
                std::os::unix::net::UnixStream::connect(&sock).expect("the control socket"),
            );
            let mut delivered = || {
                let d = c.ok(serde_json::json!({"cmd": "device", "name": "net0"}));
                d["queues"][0]["packets"].as_u64().expect("a count")
            };
            let (mut sent, mut known) = (0u64, 0u64);
            while sent < count {
                if sent >= known + ahead {
                    known = delivered();
                    if sent >= known + ahead {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    continue;
                }
                if s.send(&test_frame([0xff; 6], s.mac, 64, sent)) {
                    sent += 1;
                }
            }
            sent
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// The network bench's packet socket (a module of the `ppa-vmm` binary, which a test cannot
/// import: compiled into the test from its file).
#[path = "../../cli/src/bench/net/packet.rs"]
mod packet;

#[allow(unused_imports, reason = "used by the network tests only")]
pub use packet::{test_frame, PacketSocket};

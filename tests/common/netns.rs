//! A network namespace of the test's own with a tap in it, so that no test frame can leave
//! this machine: the VMM runs inside it (`ip netns exec`), and the test's own packet socket
//! is opened from a thread that joined it (`setns` changes only the calling thread).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A raw packet socket on one interface (AF_PACKET): frames in and out as bytes.
pub struct PacketSocket {
    fd: OwnedFd,
    /// The interface's MAC address.
    pub mac: [u8; 6],
}

impl PacketSocket {
    /// Opens a socket on interface `ifname` of the calling thread's namespace, with a receive
    /// timeout of `timeout_ms`.
    pub fn open(ifname: &str, timeout_ms: u64) -> PacketSocket {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: socket() takes integers; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        assert!(
            fd >= 0,
            "packet socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` is new and ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert!(ifindex > 0, "no interface {ifname}");
        // SAFETY: sockaddr_ll is plain data; zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: (timeout_ms / 1000) as i64,
            tv_usec: ((timeout_ms % 1000) * 1000) as i64,
        };
        // SAFETY: `tv` is a valid timeval of the size given.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        // The interface's address (SIOCGIFHWADDR: /sys shows the namespace it was mounted in,
        // not this thread's).
        let mut req = [0u8; 40];
        for (d, b) in req.iter_mut().zip(ifname.bytes()) {
            *d = b;
        }
        // SAFETY: SIOCGIFHWADDR reads the name from and writes a sockaddr into a 40-byte
        // ifreq, which `req` is.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, req.as_mut_ptr()) };
        assert_eq!(rc, 0, "SIOCGIFHWADDR: {}", std::io::Error::last_os_error());
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&req[18..24]);
        PacketSocket { fd, mac }
    }

    /// Sends one frame; false when the kernel refused it (a full queue).
    pub fn send(&self, frame: &[u8]) -> bool {
        // SAFETY: `frame` is valid for reads of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        n == frame.len() as isize
    }

    /// Receives one frame into `buf` (its length), or None at the timeout.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        (n >= 0).then_some(n as usize)
    }
}

/// A frame of `size` bytes from `src` to `dst` with the tiny guest's EtherType and `seq`.
pub fn test_frame(dst: [u8; 6], src: [u8; 6], size: usize, seq: u64) -> Vec<u8> {
    let mut f = Vec::with_capacity(size);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ppa_guest_abi::NET_ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    f.resize(size.max(f.len()), 0x5a);
    f
}

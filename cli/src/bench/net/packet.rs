//! A raw packet socket (AF_PACKET) on one interface of the calling thread's network
//! namespace: frames in and out as bytes. The network bench's echo peer, and the tests' host
//! side of a tap. tests/common/netns.rs compiles this file into the tests (`#[path]`): it uses
//! std and libc only, never `crate::`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A raw packet socket on one interface.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    /// The interface's MAC address.
    pub mac: [u8; 6],
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl PacketSocket {
    /// Opens a socket on interface `ifname` of the calling thread's namespace (needs
    /// CAP_NET_RAW), with a receive timeout of `timeout_ms`.
    pub fn open(ifname: &str, timeout_ms: u64) -> io::Result<PacketSocket> {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: socket() takes integers; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        check(fd)?;
        // SAFETY: `fd` is new and ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = std::ffi::CString::new(ifname)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the name"))?;
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: sockaddr_ll is plain data; zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size given.
        check(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        })?;
        let tv = libc::timeval {
            tv_sec: (timeout_ms / 1000) as i64,
            tv_usec: ((timeout_ms % 1000) * 1000) as i64,
        };
        // SAFETY: `tv` is a valid timeval of the size given.
        check(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        })?;
        // The interface's address (SIOCGIFHWADDR: /sys shows the namespace it was mounted in,
        // not this thread's). An ifreq is 40 bytes: the name, then a sockaddr whose data
        // starts at byte 18.
        let mut req = [0u8; 40];
        for (d, b) in req.iter_mut().zip(ifname.bytes().take(15)) {
            *d = b;
        }
        // SAFETY: SIOCGIFHWADDR reads the name from and writes a sockaddr into a 40-byte
        // ifreq, which `req` is.
        check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFHWADDR, req.as_mut_ptr()) })?;
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&req[18..24]);
        Ok(PacketSocket { fd, mac })
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

/// A frame of `size` bytes from `src` to `dst` with the tiny guest's EtherType (0x88B5) and
/// `seq` after the header.
pub fn test_frame(dst: [u8; 6], src: [u8; 6], size: usize, seq: u64) -> Vec<u8> {
    let mut f = Vec::with_capacity(size);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ppa_guest_abi::NET_ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    f.resize(size.max(f.len()), 0x5a);
    f
}

//! A tap interface opened by name, one file descriptor per queue pair: frames with a virtio
//! network header in front (`IFF_VNET_HDR`, the 12-byte header of virtio 1.x), non-blocking.
//!
//! Data flow: [`Tap::open`] attaches to the tap `NAME` (or creates it, where the kernel lets
//! this process: CAP_NET_ADMIN; a tap created so goes away with the VMM and starts down) with
//! `IFF_MULTI_QUEUE` when there are several queue pairs; each queue pair's thread then owns one
//! [`Tap`]: it reads frames the host sends to the guest and writes the guest's frames with
//! `writev` straight from guest memory. [`Tap::set_offload`] tells the kernel which offloads
//! the guest accepts on what it receives; [`Tap::enable`] attaches or detaches a queue when the
//! guest changes how many queue pairs it uses.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::Path;

use thiserror::Error;

mod link;
pub mod ring;

/// Length of the virtio 1.x network header in front of every frame.
pub const VNET_HDR_LEN: usize = 12;
/// Longest interface name (IFNAMSIZ less the NUL).
pub const MAX_NAME: usize = 15;

/// Why a tap could not be opened or set up.
#[derive(Debug, Error)]
pub enum TapError {
    /// No /dev/net/tun.
    #[error("there is no /dev/net/tun (load the tun module: modprobe tun)")]
    NoTunDevice(#[source] io::Error),
    /// /dev/net/tun could not be opened.
    #[error("cannot open /dev/net/tun")]
    OpenTun(#[source] io::Error),
    /// The tap does not exist and this VMM may not create it.
    #[error(
        "the tap {name} does not exist and this VMM may not create it (that takes CAP_NET_ADMIN); \
         create it first: ip tuntap add dev {name} mode tap vnet_hdr{mq} user $(id -u) && ip link set {name} up"
    )]
    MayNotCreate {
        /// Interface name.
        name: String,
        /// " multi_queue" when several queues were asked.
        mq: &'static str,
    },
    /// The tap exists but belongs to another user or group.
    #[error("the tap {name} exists but this VMM may not attach to it (it was made for another user or group)")]
    NotOurs {
        /// Interface name.
        name: String,
    },
    /// The interface exists and is not a tap.
    #[error(
        "{name} is not a tap ({what}); virtio-net needs one: ip tuntap add dev TAP mode tap vnet_hdr"
    )]
    NotATap {
        /// Interface name.
        name: String,
        /// What it is instead.
        what: &'static str,
    },
    /// The tap's multi-queue flag does not match the queue pairs asked.
    #[error("the tap {name} was made {made} and --net asks for {queues} queue pair(s); {fix}")]
    QueueMismatch {
        /// Interface name.
        name: String,
        /// "with multi_queue" or "without multi_queue".
        made: &'static str,
        /// Queue pairs asked.
        queues: usize,
        /// What to do.
        fix: &'static str,
    },
    /// A single-queue tap another process reads.
    #[error("the tap {name} is in use by another process (a tap made without multi_queue has one reader)")]
    InUse {
        /// Interface name.
        name: String,
    },
    /// A multi-queue tap with queues another process holds.
    #[error(
        "the tap {name} already has {others} queue(s) of another process (another VMM?): two \
         readers of one tap split its traffic, each frame going to one of them"
    )]
    Shared {
        /// Interface name.
        name: String,
        /// Queues attached or detached that are not this VMM's.
        others: u32,
    },
    /// Another error attaching to the tap.
    #[error("cannot attach to the tap {name}")]
    Busy {
        /// Interface name.
        name: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Another ioctl failed.
    #[error("cannot {what} the tap {name}")]
    Ioctl {
        /// What was being done.
        what: &'static str,
        /// Interface name.
        name: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// `struct ifreq` with the name and flags member (the rest of the union is padding here).
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// One queue of a tap.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

/// Whether an interface `name` exists in this network namespace now.
pub fn exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// `tun_flags` of an existing tun or tap `name` (as `/sys/class/net` shows it), or None when
/// the interface is not one (or is not there).
fn tun_flags(name: &str) -> Option<u32> {
    let t =
        std::fs::read_to_string(Path::new("/sys/class/net").join(name).join("tun_flags")).ok()?;
    u32::from_str_radix(t.trim().trim_start_matches("0x"), 16).ok()
}

/// Why the kernel refused (EINVAL) to attach to an existing interface `name`.
fn refused(name: &str, queues: usize, e: io::Error) -> TapError {
    let name_s = name.to_string();
    if !exists(name) {
        return TapError::Busy {
            name: name_s,
            source: e,
        };
    }
    let Some(flags) = tun_flags(name) else {
        return TapError::NotATap {
            name: name_s,
            what: "not a tun or tap device",
        };
    };
    if flags & libc::IFF_TUN as u32 != 0 {
        return TapError::NotATap {
            name: name_s,
            what: "a tun device, which carries IP packets, not Ethernet frames",
        };
    }
    let mq = flags & libc::IFF_MULTI_QUEUE as u32 != 0;
    match (mq, queues > 1) {
        (true, false) => TapError::QueueMismatch {
            name: name_s,
            made: "with multi_queue",
            queues,
            fix: "give --net ...,queues=N (N > 1) or make the tap without multi_queue",
        },
        (false, true) => TapError::QueueMismatch {
            name: name_s,
            made: "without multi_queue",
            queues,
            fix: "make it with multi_queue (ip tuntap add dev TAP mode tap vnet_hdr multi_queue) or give queues=1",
        },
        _ => TapError::Busy { name: name_s, source: e },
    }
}

impl Tap {
    /// Opens `queues` queues of the tap `name` (checked by the caller: 1 to 15 bytes, no `/`),
    /// and refuses a multi-queue tap with queues of another process attached (two readers
    /// would split its traffic), as the kernel's own count says.
    pub fn open(name: &str, queues: usize) -> Result<Vec<Tap>, TapError> {
        let taps = (0..queues.max(1))
            .map(|_| Tap::open_one(name, queues))
            .collect::<Result<Vec<Tap>, TapError>>()?;
        if queues > 1 {
            match link::queues(name) {
                Ok(Some((on, off))) if on + off > queues as u32 => {
                    return Err(TapError::Shared {
                        name: name.to_string(),
                        others: on + off - queues as u32,
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    log::warn!("cannot ask the kernel how many queues the tap {name} has: {e}")
                }
            }
        }
        Ok(taps)
    }

    fn open_one(name: &str, queues: usize) -> Result<Tap, TapError> {
        let multi_queue = queues > 1;
        // SAFETY: the path is a NUL-terminated literal; the result is checked.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.kind() {
                io::ErrorKind::NotFound => TapError::NoTunDevice(e),
                _ => TapError::OpenTun(e),
            });
        }
        // SAFETY: `fd` is a new descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short,
            _pad: [0; 22],
        };
        if multi_queue {
            req.flags |= libc::IFF_MULTI_QUEUE as libc::c_short;
        }
        for (d, s) in req.name.iter_mut().zip(name.bytes().take(MAX_NAME)) {
            *d = s as libc::c_char;
        }
        let existed = exists(name);
        // SAFETY: TUNSETIFF reads (and writes back the name into) an ifreq, which `req` is,
        // valid for the call; the result is checked.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            let name = name.to_string();
            return Err(match (e.raw_os_error(), existed) {
                (Some(libc::EPERM), false) => TapError::MayNotCreate {
                    name,
                    mq: if multi_queue { " multi_queue" } else { "" },
                },
                (Some(libc::EPERM), true) => TapError::NotOurs { name },
                (Some(libc::EBUSY), true) => TapError::InUse { name },
                (Some(libc::EINVAL), true) => refused(&name, queues, e),
                _ => TapError::Busy { name, source: e },
            });
        }
        let tap = Tap {
            file,
            name: name.to_string(),
        };
        let hdr: libc::c_int = VNET_HDR_LEN as libc::c_int;
        tap.ioctl_int("set the header size of", libc::TUNSETVNETHDRSZ, &hdr)?;
        Ok(tap)
    }

    fn ioctl_int<T>(&self, what: &'static str, req: libc::Ioctl, arg: &T) -> Result<(), TapError> {
        // SAFETY: the tap ioctls used here read one integer through the pointer, which points
        // at a live value of the size the ioctl expects; the result is checked.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), req, arg as *const T) };
        if rc < 0 {
            return Err(TapError::Ioctl {
                what,
                name: self.name.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Which offloads the guest takes on received frames (`TUN_F_*`): the kernel then sends
    /// checksum-less and segmentation-offloaded frames only where the guest said it can.
    pub fn set_offload(&self, flags: libc::c_uint) -> Result<(), TapError> {
        // TUNSETOFFLOAD takes the flags as the argument itself, not a pointer.
        // SAFETY: TUNSETOFFLOAD reads its integer argument by value; the result is checked.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(flags),
            )
        };
        if rc < 0 {
            return Err(TapError::Ioctl {
                what: "set the offloads of",
                name: self.name.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Attaches (true) or detaches (false) this queue of a multi-queue tap: the kernel spreads
    /// frames for the guest only over attached queues.
    pub fn enable(&self, on: bool) -> Result<(), TapError> {
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: if on {
                libc::IFF_ATTACH_QUEUE
            } else {
                libc::IFF_DETACH_QUEUE
            } as libc::c_short,
            _pad: [0; 22],
        };
        // SAFETY: TUNSETQUEUE reads an ifreq, which `req` is; the result is checked.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), libc::TUNSETQUEUE, &mut req) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            // Attaching an attached queue or detaching a detached one says EINVAL: no change.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(TapError::Ioctl {
                    what: if on {
                        "attach a queue of"
                    } else {
                        "detach a queue of"
                    },
                    name: self.name.clone(),
                    source: e,
                });
            }
        }
        Ok(())
    }

    /// Reads one frame (with its header) into `buf`; `WouldBlock` when none is waiting.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length for the call; the result is checked.
        let n = unsafe { libc::read(self.file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Reads one frame (header first) scattered over `iov`. Returns the bytes read: a frame
    /// longer than the buffers is cut to them and its length is lost (`tun_chr_read_iter`
    /// clamps it to the buffers'), so a caller that must tell offers one byte more than the
    /// longest frame it takes; `WouldBlock` when none waits.
    ///
    /// # Safety
    /// Every `iovec` must describe memory valid for writes of its length for the call (guest
    /// memory written by the kernel, not through a Rust reference).
    pub unsafe fn readv(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let cnt = iov.len().min(libc::UIO_MAXIOV as usize) as libc::c_int;
        // SAFETY: the caller's contract covers every iovec; `cnt` is at most their number.
        let n = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), cnt) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Writes one frame (header first) gathered from `iov`.
    ///
    /// # Safety
    /// Every `iovec` must describe memory valid for reads of its length for the call (guest
    /// memory may change under the kernel's copy: that is the guest's business, not UB here,
    /// since the kernel reads it, not Rust).
    pub unsafe fn writev(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let cnt = iov.len().min(libc::UIO_MAXIOV as usize) as libc::c_int;
        // SAFETY: the caller's contract covers every iovec; `cnt` is at most their number.
        let n = unsafe { libc::writev(self.file.as_raw_fd(), iov.as_ptr(), cnt) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes the tap outlive this descriptor (true) or go with the last one (false).
    pub fn set_persist(&self, on: bool) -> Result<(), TapError> {
        // TUNSETPERSIST takes its flag by value.
        // SAFETY: TUNSETPERSIST reads its integer argument by value; the result is checked.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETPERSIST,
                libc::c_ulong::from(on),
            )
        };
        if rc < 0 {
            return Err(TapError::Ioctl {
                what: "set the persistence of",
                name: self.name.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

/// `struct ifreq` with the name and an integer member (`ifr_mtu`).
#[repr(C)]
struct IfReqInt {
    name: [libc::c_char; libc::IFNAMSIZ],
    value: libc::c_int,
    _pad: [u8; 20],
}

/// An `AF_INET` datagram socket for interface ioctls.
fn ioctl_socket() -> io::Result<File> {
    // SAFETY: socket() takes integers; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is new and ours; File closes it.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The MTU of interface `name` (SIOCGIFMTU; any user may read it).
pub fn mtu(name: &str) -> io::Result<u32> {
    let sock = ioctl_socket()?;
    let mut req = IfReqInt {
        name: [0; libc::IFNAMSIZ],
        value: 0,
        _pad: [0; 20],
    };
    for (d, s) in req.name.iter_mut().zip(name.bytes().take(MAX_NAME)) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU writes the MTU into the ifreq `req` is, valid for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(req.value.max(0) as u32)
}

/// Sets the MTU of interface `name` (SIOCSIFMTU; needs CAP_NET_ADMIN).
pub fn set_mtu(name: &str, mtu: u32) -> io::Result<()> {
    let sock = ioctl_socket()?;
    let mut req = IfReqInt {
        name: [0; libc::IFNAMSIZ],
        value: mtu.min(i32::MAX as u32) as libc::c_int,
        _pad: [0; 20],
    };
    for (d, s) in req.name.iter_mut().zip(name.bytes().take(MAX_NAME)) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCSIFMTU reads the ifreq `req` is, valid for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFMTU, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the transmit queue length of interface `name` (SIOCSIFTXQLEN; needs CAP_NET_ADMIN):
/// for a tap, how many frames for the guest it holds while nobody reads them. For the
/// benchmarks' own taps.
pub fn set_txqueuelen(name: &str, len: u32) -> io::Result<()> {
    let sock = ioctl_socket()?;
    let mut req = IfReqInt {
        name: [0; libc::IFNAMSIZ],
        value: len.min(i32::MAX as u32) as libc::c_int,
        _pad: [0; 20],
    };
    for (d, s) in req.name.iter_mut().zip(name.bytes().take(MAX_NAME)) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCSIFTXQLEN reads the ifreq `req` is, valid for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFTXQLEN, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Brings the interface `name` of this thread's network namespace up (what `ip link set NAME
/// up` does; needs CAP_NET_ADMIN). For the benchmarks' own taps.
pub fn set_up(name: &str) -> io::Result<()> {
    let sock = ioctl_socket()?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: 0,
        _pad: [0; 22],
    };
    for (d, s) in req.name.iter_mut().zip(name.bytes().take(MAX_NAME)) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write an ifreq, which `req` is.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

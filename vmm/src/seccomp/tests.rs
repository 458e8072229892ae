//! Tests of the seccomp module: the lists and their programs, capabilities dropped per thread,
//! the SIGSYS message, docs/security.md naming every entry. That each kind's filter stops a
//! forbidden call is tested in `tests/seccomp.rs`, in child processes.

use super::allow::{self, Args};
use super::*;

#[test]
fn lists_have_one_entry_per_call_and_compile_in_every_mode() {
    for kind in Kind::ALL {
        let list = allow::list(kind);
        let mut nrs: Vec<i64> = list.iter().map(|a| a.nr).collect();
        nrs.dedup();
        assert_eq!(nrs.len(), list.len(), "{}", kind.name());
        for call in ["futex", "exit", "exit_group", "write", "rt_sigreturn"] {
            assert!(
                list.iter().any(|a| a.name == call),
                "{} lacks {call}",
                kind.name()
            );
        }
        for banned in [
            "socket", "connect", "execve", "clone", "clone3", "fork", "ptrace",
        ] {
            assert!(
                !list.iter().any(|a| a.name == banned),
                "{} has {banned}",
                kind.name()
            );
        }
        for mode in [Mode::Log, Mode::Kill] {
            let p = allow::program(kind, &allow::Context::current(mode)).unwrap();
            assert!(!p.is_empty());
        }
    }
    let vcpu = allow::list(Kind::Vcpu);
    let ioctl = vcpu.iter().find(|a| a.name == "ioctl").unwrap();
    assert!(
        matches!(ioctl.args, Args::Ioctl(r) if r.iter().any(|(n, _)| *n == "KVM_KVMCLOCK_CTRL"))
    );
    // Every KVM ioctl the backend names for the vCPU thread, then level full's perf ones.
    let Args::Ioctl(reqs) = ioctl.args else {
        panic!("the vCPU thread's ioctl entry checks no request")
    };
    let names: Vec<&str> = reqs.iter().map(|(n, _)| *n).collect();
    let kvm = crate::hypervisor::kvm::ioctls::VCPU_THREAD_IOCTLS;
    assert_eq!(&reqs[..kvm.len()], kvm, "{names:?}");
    assert_eq!(names.len(), kvm.len() + 3, "{names:?}");
    // Level full's records: the vCPU threads open them on themselves and switch them.
    for req in ["PERF_EVENT_IOC_ENABLE", "PERF_EVENT_IOC_DISABLE"] {
        assert!(matches!(ioctl.args, Args::Ioctl(r) if r.iter().any(|(n, _)| *n == req)));
    }
    for kind in Kind::ALL {
        let perf = allow::list(kind)
            .into_iter()
            .find(|a| a.name == "perf_event_open");
        match kind {
            Kind::Vcpu => assert_eq!(perf.map(|a| a.args), Some(Args::PerfSelf)),
            _ => assert!(perf.is_none(), "{} may open perf events", kind.name()),
        }
    }
}

#[test]
fn capabilities_drop_on_the_calling_thread_only() {
    let before = caps::current().unwrap();
    let after = std::thread::spawn(|| {
        let kept = caps::drop_all_but(caps::bit(caps::CAP_DAC_OVERRIDE)).unwrap();
        (kept, caps::current().unwrap())
    })
    .join()
    .unwrap();
    let (kept, (effective, permitted)) = after;
    assert_eq!(kept, before.1 & caps::bit(caps::CAP_DAC_OVERRIDE));
    assert_eq!(effective, kept);
    assert_eq!(permitted, kept);
    assert_eq!(
        caps::current().unwrap(),
        before,
        "another thread's drop changed this one"
    );
    assert_eq!(caps::names(0), "none");
    assert_eq!(
        caps::names(caps::bit(1) | caps::bit(21)),
        "CAP_DAC_OVERRIDE, cap 21"
    );
}

#[test]
fn the_sigsys_message_names_the_kind_and_the_call() {
    let mut buf = [0u8; 256];
    let n = sigsys_message(&mut buf, "api", 41);
    let text = std::str::from_utf8(&buf[..n]).unwrap();
    assert!(text.starts_with("ppa-vmm: error: the api thread made system call 41, which"));
    assert!(text.ends_with('\n'));
    let n = sigsys_message(&mut buf, "x", -1);
    assert!(std::str::from_utf8(&buf[..n])
        .unwrap()
        .contains("system call -1,"));
}

#[test]
fn security_doc_names_every_entry() {
    let doc = include_str!("../../../docs/security.md");
    for kind in Kind::ALL {
        assert!(
            doc.contains(&format!("`{}`", kind.name())),
            "kind {}",
            kind.name()
        );
        for a in allow::list(kind) {
            assert!(doc.contains(&format!("`{}`", a.name)), "{}", a.name);
            if let Args::Ioctl(reqs) = a.args {
                for (name, _) in reqs {
                    assert!(doc.contains(name), "{name}");
                }
            }
        }
    }
}

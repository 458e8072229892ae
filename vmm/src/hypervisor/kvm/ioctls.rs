//! The KVM ioctls a vCPU thread makes after its set-up, exported for its seccomp filter.
//!
//! Data flow: the KVM backend's `Vcpu` methods that a vCPU thread calls in its loop (run,
//! `pause_notify`, the state and registers a report reads) are KVM_RUN, KVM_KVMCLOCK_CTRL,
//! KVM_GET_MP_STATE, KVM_GET_REGS and KVM_GET_SREGS; [`VCPU_THREAD_IOCTLS`] names them, and
//! `seccomp::allow` lets the vCPU thread make those and no other KVM ioctl. A backend method
//! that starts using another ioctl on the vCPU thread adds it here, beside the code.

use std::mem::size_of;

const KVMIO: u64 = 0xae;
const fn io(nr: u64) -> u64 {
    (KVMIO << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (KVMIO << 8) | nr
}

/// KVM_RUN.
pub const KVM_RUN: u64 = io(0x80);
/// KVM_GET_REGS.
pub const KVM_GET_REGS: u64 = ior(0x81, size_of::<kvm_bindings::kvm_regs>());
/// KVM_GET_SREGS.
pub const KVM_GET_SREGS: u64 = ior(0x83, size_of::<kvm_bindings::kvm_sregs>());
/// KVM_GET_MP_STATE.
pub const KVM_GET_MP_STATE: u64 = ior(0x98, size_of::<kvm_bindings::kvm_mp_state>());
/// KVM_KVMCLOCK_CTRL.
pub const KVM_KVMCLOCK_CTRL: u64 = io(0xad);

/// The KVM ioctls of a vCPU thread's loop (name, number).
pub const VCPU_THREAD_IOCTLS: &[(&str, u64)] = &[
    ("KVM_RUN", KVM_RUN),
    ("KVM_KVMCLOCK_CTRL", KVM_KVMCLOCK_CTRL),
    ("KVM_GET_MP_STATE", KVM_GET_MP_STATE),
    ("KVM_GET_REGS", KVM_GET_REGS),
    ("KVM_GET_SREGS", KVM_GET_SREGS),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_ioctl_numbers_are_the_kernels() {
        // From <linux/kvm.h> on x86_64.
        assert_eq!(KVM_RUN, 0xae80);
        assert_eq!(KVM_GET_REGS, 0x8090_ae81);
        assert_eq!(KVM_GET_SREGS, 0x8138_ae83);
        assert_eq!(KVM_GET_MP_STATE, 0x8004_ae98);
        assert_eq!(KVM_KVMCLOCK_CTRL, 0xaead);
    }
}

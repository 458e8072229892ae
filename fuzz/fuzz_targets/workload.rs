//! Fuzz target `workload`: the properties are those of `ppa_vmm::fuzzing::workload`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ppa_vmm::fuzzing::workload(data));

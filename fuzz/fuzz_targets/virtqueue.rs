//! Fuzz target `virtqueue`: the properties are those of `ppa_vmm::fuzzing::virtqueue`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ppa_vmm::fuzzing::virtqueue(data));

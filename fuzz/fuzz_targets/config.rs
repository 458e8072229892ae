//! Fuzz target `config`: the properties are those of `ppa_vmm::fuzzing::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ppa_vmm::fuzzing::config(data));

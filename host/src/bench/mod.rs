//! `strata bench`: the kernels against the device's copy bandwidth ([`kernels`]) and the decode
//! loop's speed ([`decode`]).
pub mod decode;
pub mod kernels;

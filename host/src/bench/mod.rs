//! `strata bench`: the kernels against the device's copy bandwidth ([`kernels`]), the decode
//! loop's speed ([`decode`]) and a step's launches laid out in time ([`timeline`]).
pub mod decode;
pub mod kernels;
pub mod timeline;

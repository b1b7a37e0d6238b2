//! A userspace `libibverbs.so.1` for tests: one software RoCE device whose RC queue pairs carry
//! two-sided SENDs between processes over Unix-domain sockets in a shared directory.
//! See README.md for semantics and limits. Not a transport to deploy.

pub mod abi;
pub mod cq;
pub mod device;
pub mod error;
pub mod ffi;
pub mod mr;
pub mod qp;
pub mod unsupported;
pub mod wire;

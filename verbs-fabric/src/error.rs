//! Errors inside the fabric; the C ABI turns them into errno values.
use libc::c_int;

#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error("work queue full")]
    QueueFull,
    #[error("not supported: {0}")]
    Unsupported(&'static str),
    #[error("fabric directory path too long for a Unix socket")]
    PathTooLong,
    #[error("no free queue-pair number")]
    NoQpn,
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl FabricError {
    /// The errno a real libibverbs call reports for this failure.
    pub fn errno(&self) -> c_int {
        match self {
            FabricError::Invalid(_) => libc::EINVAL,
            FabricError::QueueFull => libc::ENOMEM,
            FabricError::Unsupported(_) => libc::EOPNOTSUPP,
            FabricError::PathTooLong => libc::ENAMETOOLONG,
            FabricError::NoQpn => libc::EAGAIN,
            FabricError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

pub type Result<T> = std::result::Result<T, FabricError>;

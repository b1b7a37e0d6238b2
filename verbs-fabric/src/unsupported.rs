//! Exported stubs for libibverbs functions this fabric does not implement but that other system
//! libraries linked with `-z now` import at load time (librdmacm, which `rdma-sys` links): without
//! them such a process would not even start. Each one fails as a provider lacking the feature
//! does (EOPNOTSUPP / NULL) or does nothing.
use crate::device;
use libc::{c_char, c_int, c_void};

fn fail<T>(ret: T) -> T {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
    ret
}

#[no_mangle]
pub extern "C" fn ibv_query_device(_ctx: *mut c_void, _attr: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn ibv_create_ah(_pd: *mut c_void, _attr: *mut c_void) -> *mut c_void {
    fail(std::ptr::null_mut())
}

#[no_mangle]
pub extern "C" fn ibv_destroy_ah(_ah: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn ibv_create_srq(_pd: *mut c_void, _attr: *mut c_void) -> *mut c_void {
    fail(std::ptr::null_mut())
}

#[no_mangle]
pub extern "C" fn ibv_destroy_srq(_srq: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn ibv_attach_mcast(_qp: *mut c_void, _gid: *const c_void, _lid: u16) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn ibv_detach_mcast(_qp: *mut c_void, _gid: *const c_void, _lid: u16) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn ibv_query_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn ibv_set_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// Kernel-ABI conversions (rdma_cm paths only): nothing to convert without a kernel.
#[no_mangle]
pub extern "C" fn ibv_copy_ah_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {}

#[no_mangle]
pub extern "C" fn ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *const c_void) {}

#[no_mangle]
pub extern "C" fn ibv_copy_qp_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {}

#[no_mangle]
pub extern "C" fn ibv_get_device_index(dev: *mut crate::ffi::ibv_device) -> c_int {
    if dev == device::device() {
        0
    } else {
        -1
    }
}

/// The port's only pkey is the default 0xffff (big-endian on the wire, same bytes either way).
#[no_mangle]
pub extern "C" fn ibv_get_pkey_index(_ctx: *mut c_void, port: u8, pkey: u16) -> c_int {
    if port == device::PORT && pkey == 0xffff {
        0
    } else {
        -1
    }
}

#[no_mangle]
pub extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    -1
}

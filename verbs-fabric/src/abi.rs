//! The exported libibverbs functions and the context's ops-table entries. Every entry point
//! catches panics so none unwinds into C; failures set errno (pointer returns) or return it.
use crate::cq::{ChanInner, Channel, Cq, CqInner};
use crate::device::{self, Context};
use crate::error::FabricError;
use crate::ffi::*;
use crate::mr::{Mr, MrInfo};
use crate::qp::{Modified, Qp, QpInner, QpState, MAX_INLINE, MAX_SGE, MAX_WR};
use crate::wire;
use libc::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};

static HANDLES: AtomicU32 = AtomicU32::new(1);

fn guard<T>(fail: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fail)
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn null_with<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

fn new_handle() -> u32 {
    HANDLES.fetch_add(1, Ordering::Relaxed)
}

/// # Safety
/// `ctx` must come from `ibv_open_device` (always a `Context`).
unsafe fn ctx_ref<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
    // SAFETY: per the contract, a non-null ctx points to a live Context (ibv_context first).
    unsafe { (ctx as *const Context).as_ref() }
}

#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// # Safety
/// `num` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard(null_mut(), || {
        // SAFETY: a NULL-terminated array of two pointers, released by ibv_free_device_list.
        let list = unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_device>()) }
            as *mut *mut ibv_device;
        if list.is_null() {
            return null_with(libc::ENOMEM);
        }
        // SAFETY: list has room for two pointers; num is NULL or writable per the contract.
        unsafe {
            *list = device::device();
            if !num.is_null() {
                *num = 1;
            }
        }
        list
    })
}

/// # Safety
/// `list` comes from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: list was allocated with calloc in ibv_get_device_list.
    unsafe { libc::free(list.cast()) };
}

#[no_mangle]
pub extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() || dev != device::device() {
        return std::ptr::null();
    }
    device::DEVICE_NAME.as_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_get_device_guid(_dev: *mut ibv_device) -> u64 {
    0x0200_00ff_fe00_0001u64.to_be()
}

#[no_mangle]
pub extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard(null_mut(), || {
        if dev.is_null() || dev != device::device() {
            return null_with(libc::ENODEV);
        }
        // SAFETY: ibv_context is plain C data (pointers, ints, a pthread mutex): zero is valid,
        // and a zeroed glibc mutex is PTHREAD_MUTEX_INITIALIZER.
        let mut ibv: ibv_context = unsafe { std::mem::zeroed() };
        ibv.device = dev;
        ibv.cmd_fd = -1;
        ibv.async_fd = -1;
        ibv.num_comp_vectors = 1;
        ibv.ops.poll_cq = Some(poll_cq);
        ibv.ops.req_notify_cq = Some(req_notify_cq);
        ibv.ops.post_send = Some(post_send);
        ibv.ops.post_recv = Some(post_recv);
        let ctx = Box::new(Context {
            ibv,
            gids: Arc::new(device::local_gids()),
            mrs: Arc::default(),
        });
        Box::into_raw(ctx).cast()
    })
}

/// # Safety
/// `ctx` comes from `ibv_open_device` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    guard(libc::EINVAL, || {
        if ctx.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ctx was created by Box::into_raw in ibv_open_device.
        drop(unsafe { Box::from_raw(ctx as *mut Context) });
        0
    })
}

/// # Safety
/// `ctx` from `ibv_open_device`; `attr` writable `ibv_port_attr` (the header's macro passes one).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    guard(libc::EINVAL, || {
        // SAFETY: per the contract.
        let Some(c) = (unsafe { ctx_ref(ctx) }) else {
            return libc::EINVAL;
        };
        if port != device::PORT || attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: attr is a writable ibv_port_attr per the contract.
        unsafe { attr.write(device::port_attr(c)) };
        0
    })
}

/// # Safety
/// `ctx` from `ibv_open_device`; `gid` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: per the contract.
        let Some(c) = (unsafe { ctx_ref(ctx) }) else {
            return -1;
        };
        let Some(g) = usize::try_from(index).ok().and_then(|i| c.gids.get(i)) else {
            return -1;
        };
        if port != device::PORT || gid.is_null() {
            return -1;
        }
        // SAFETY: gid is writable per the contract.
        unsafe { gid.write(g.gid) };
        0
    })
}

fn gid_entry(c: &Context, i: usize) -> Option<ibv_gid_entry> {
    c.gids.get(i).map(|g| ibv_gid_entry {
        gid: g.gid,
        gid_index: i as u32,
        port_num: u32::from(device::PORT),
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex: g.ifindex,
    })
}

/// # Safety
/// `ctx` from `ibv_open_device`; `entry` writable for `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard(libc::EINVAL, || {
        // SAFETY: per the contract.
        let Some(c) = (unsafe { ctx_ref(ctx) }) else {
            return libc::EINVAL;
        };
        if flags != 0
            || port != u32::from(device::PORT)
            || entry.is_null()
            || entry_size < std::mem::size_of::<ibv_gid_entry>()
        {
            return libc::EINVAL;
        }
        let Some(e) = gid_entry(c, index as usize) else {
            return libc::ENODATA;
        };
        // SAFETY: entry is writable per the contract (size checked above).
        unsafe { entry.write(e) };
        0
    })
}

/// # Safety
/// `ctx` from `ibv_open_device`; `entries` writable for `max` entries of `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    guard(-(libc::EINVAL as isize), || {
        // SAFETY: per the contract.
        let Some(c) = (unsafe { ctx_ref(ctx) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || entries.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        if c.gids.len() > max {
            return -(libc::EINVAL as isize);
        }
        for i in 0..c.gids.len() {
            if let Some(e) = gid_entry(c, i) {
                // SAFETY: entry i lies within the caller's array of `max` entries of entry_size.
                unsafe {
                    (entries as *mut u8)
                        .add(i * entry_size)
                        .cast::<ibv_gid_entry>()
                        .write_unaligned(e)
                };
            }
        }
        c.gids.len() as isize
    })
}

#[no_mangle]
pub extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    if ctx.is_null() {
        return null_with(libc::EINVAL);
    }
    guard(null_mut(), || {
        Box::into_raw(Box::new(ibv_pd {
            context: ctx,
            handle: new_handle(),
        }))
    })
}

/// # Safety
/// `pd` from `ibv_alloc_pd`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: pd was created by Box::into_raw in ibv_alloc_pd.
    drop(unsafe { Box::from_raw(pd) });
    0
}

/// # Safety
/// `pd` from `ibv_alloc_pd`.
unsafe fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard(null_mut(), || {
        // SAFETY: pd is a live ibv_pd whose context is a Context.
        let Some(c) = (unsafe { pd.as_ref() }).and_then(|p| unsafe { ctx_ref(p.context) }) else {
            return null_with(libc::EINVAL);
        };
        if iova != addr as u64 {
            return null_with(libc::EOPNOTSUPP);
        }
        if (addr as usize).checked_add(len).is_none() {
            return null_with(libc::EINVAL);
        }
        let key = c.mrs.insert(MrInfo {
            addr: addr as usize,
            len,
            access,
            pd: pd as usize,
        });
        let mr = Mr {
            ibv: ibv_mr {
                context: c as *const Context as *mut ibv_context,
                pd,
                addr,
                length: len,
                handle: new_handle(),
                lkey: key,
                rkey: key,
            },
        };
        Box::into_raw(Box::new(mr)).cast()
    })
}

/// # Safety
/// `pd` from `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg_mr(pd, addr, len, addr as u64, access) }
}

/// # Safety
/// `pd` from `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg_mr(pd, addr, len, iova, access) }
}

/// # Safety
/// `pd` from `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // SAFETY: forwarded contract.
    unsafe { reg_mr(pd, addr, len, iova, access as c_int) }
}

/// # Safety
/// `mr` from `ibv_reg_mr*`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    guard(libc::EINVAL, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: mr was created by Box::into_raw in reg_mr; its context is still open.
        let mr = unsafe { Box::from_raw(mr as *mut Mr) };
        // SAFETY: as above.
        if let Some(c) = unsafe { ctx_ref(mr.ibv.context) } {
            c.mrs.remove(mr.ibv.lkey);
        }
        0
    })
}

#[no_mangle]
pub extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    guard(null_mut(), || {
        if ctx.is_null() {
            return null_with(libc::EINVAL);
        }
        match ChanInner::new() {
            Ok(inner) => {
                let ibv = ibv_comp_channel {
                    context: ctx,
                    fd: inner.fd(),
                    refcnt: 0,
                };
                Box::into_raw(Box::new(Channel {
                    ibv,
                    inner: Arc::new(inner),
                }))
                .cast()
            }
            Err(e) => null_with(e.errno()),
        }
    })
}

/// # Safety
/// `ch` from `ibv_create_comp_channel`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard(libc::EINVAL, || {
        if ch.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ch was created by Box::into_raw; CQs share the pipe through their own Arc.
        drop(unsafe { Box::from_raw(ch as *mut Channel) });
        0
    })
}

/// # Safety
/// `ctx` from `ibv_open_device`; `ch` NULL or from `ibv_create_comp_channel`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut ibv_comp_channel,
    _comp_vector: c_int,
) -> *mut ibv_cq {
    guard(null_mut(), || {
        if ctx.is_null() || !(1..=65536).contains(&cqe) {
            return null_with(libc::EINVAL);
        }
        // SAFETY: ch is NULL or a live Channel.
        let chan = unsafe { (ch as *const Channel).as_ref() }.map(|c| c.inner.clone());
        // SAFETY: ibv_cq is plain C data; zero is valid (glibc's static mutex/cond initialisers).
        let mut ibv: ibv_cq = unsafe { std::mem::zeroed() };
        ibv.context = ctx;
        ibv.channel = ch;
        ibv.cq_context = cq_context;
        ibv.handle = new_handle();
        ibv.cqe = cqe;
        let cq = Box::into_raw(Box::new(Cq {
            ibv,
            inner: Arc::new(CqInner::new(cqe as usize, chan)),
        }));
        // SAFETY: cq was just allocated.
        unsafe { (*cq).inner.set_ptr(cq.cast()) };
        cq.cast()
    })
}

/// # Safety
/// `cq` from `ibv_create_cq`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard(libc::EINVAL, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: cq was created by Box::into_raw; QPs hold their own Arc to the queue.
        let cq = unsafe { Box::from_raw(cq as *mut Cq) };
        cq.inner.set_ptr(null_mut());
        0
    })
}

/// # Safety
/// `ch` from `ibv_create_comp_channel`; `cq`, `cq_ctx` writable.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_ctx: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: ch is NULL or a live Channel.
        let Some(c) = (unsafe { (ch as *const Channel).as_ref() }) else {
            return -1;
        };
        match c.inner.get_event() {
            Ok(p) => {
                let p = p as *mut ibv_cq;
                // SAFETY: p is the live CQ that fired; cq/cq_ctx are writable per the contract.
                unsafe {
                    if !cq.is_null() {
                        *cq = p;
                    }
                    if !cq_ctx.is_null() && !p.is_null() {
                        *cq_ctx = (*p).cq_context;
                    }
                }
                if p.is_null() {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                0
            }
            Err(e) => {
                set_errno(e.errno());
                -1
            }
        }
    })
}

/// # Safety
/// `cq` from `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    // SAFETY: cq is a live ibv_cq; the counter is informational only.
    if let Some(c) = unsafe { cq.as_mut() } {
        c.comp_events_completed = c.comp_events_completed.wrapping_add(n);
    }
}

/// # Safety
/// `pd` from `ibv_alloc_pd`; `attr` a valid, writable init attribute block.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(null_mut(), || {
        // SAFETY: per the contract.
        match unsafe { create_qp(pd, attr) } {
            Ok(qp) => qp,
            Err(e) => null_with(e.errno()),
        }
    })
}

/// # Safety
/// As `ibv_create_qp`.
unsafe fn create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<*mut ibv_qp, FabricError> {
    // SAFETY: pd/attr valid per the contract; pd's context is a Context.
    let (pdr, a) = unsafe { (pd.as_ref(), attr.as_mut()) };
    let (Some(pdr), Some(a)) = (pdr, a) else {
        return Err(FabricError::Invalid("pd/attr"));
    };
    // SAFETY: as above.
    let c = unsafe { ctx_ref(pdr.context) }.ok_or(FabricError::Invalid("pd context"))?;
    if a.qp_type != IBV_QPT_RC {
        return Err(FabricError::Unsupported("only RC queue pairs"));
    }
    if a.send_cq.is_null() || a.recv_cq.is_null() || !a.srq.is_null() {
        return Err(FabricError::Invalid("CQs / SRQ"));
    }
    let cap = a.cap;
    if cap.max_send_wr > MAX_WR
        || cap.max_recv_wr > MAX_WR
        || cap.max_send_sge > MAX_SGE
        || cap.max_recv_sge > MAX_SGE
        || cap.max_inline_data > MAX_INLINE
    {
        return Err(FabricError::Invalid(
            "capabilities beyond the device's limits",
        ));
    }
    // Like hardware, grant at least a minimum (the caller reads the granted values back).
    let granted = ibv_qp_cap {
        max_send_wr: cap.max_send_wr.max(1),
        max_recv_wr: cap.max_recv_wr.max(1),
        max_send_sge: cap.max_send_sge.max(1),
        max_recv_sge: cap.max_recv_sge.max(1),
        max_inline_data: cap.max_inline_data.max(64),
    };
    a.cap = granted;
    // SAFETY: send_cq/recv_cq are live Cqs (checked non-null above).
    let (scq, rcq) = unsafe { (&*(a.send_cq as *const Cq), &*(a.recv_cq as *const Cq)) };
    let dir = device::fabric_dir();
    let (qpn, listener, sock_path) = wire::bind_qpn(&dir)?;
    let inner = Arc::new(QpInner {
        qpn,
        pd: pd as usize,
        gids: c.gids.clone(),
        mrs: c.mrs.clone(),
        send_cq: scq.inner.clone(),
        recv_cq: rcq.inner.clone(),
        cap: granted,
        sig_all: a.sq_sig_all != 0,
        st: Mutex::new(QpState::default()),
        cv: Condvar::new(),
        dir,
        sock_path,
        timeout: wire::peer_timeout(),
        stop: AtomicBool::new(false),
    });
    let l2 = listener.try_clone()?;
    let acc_qp = inner.clone();
    let acceptor = std::thread::Builder::new()
        .name(format!("fabric-acc-{qpn:06x}"))
        .spawn(move || wire::run_acceptor(acc_qp, l2))?;
    // SAFETY: ibv_qp is plain C data; zero is valid (glibc's static mutex/cond initialisers).
    let mut ibv: ibv_qp = unsafe { std::mem::zeroed() };
    ibv.context = pdr.context;
    ibv.qp_context = a.qp_context;
    ibv.pd = pd;
    ibv.send_cq = a.send_cq;
    ibv.recv_cq = a.recv_cq;
    ibv.handle = new_handle();
    ibv.qp_num = qpn;
    ibv.state = IBV_QPS_RESET;
    ibv.qp_type = IBV_QPT_RC;
    let qp = Qp {
        ibv,
        inner,
        listener: Some(listener),
        acceptor: Some(acceptor),
    };
    Ok(Box::into_raw(Box::new(qp)).cast())
}

/// # Safety
/// `qp` from `ibv_create_qp`; `attr` readable.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(libc::EINVAL, || {
        // SAFETY: qp is a live Qp; attr readable per the contract.
        let (Some(q), Some(a)) = (unsafe { (qp as *mut Qp).as_mut() }, unsafe {
            attr.as_ref()
        }) else {
            return libc::EINVAL;
        };
        match q.inner.modify(a, mask) {
            Ok(m) => {
                q.ibv.state = q.inner.lock().state;
                if let Modified::StartSender = m {
                    let inner = q.inner.clone();
                    let remote = inner.lock().remote;
                    let sgid = inner
                        .gids
                        .get(a.ah_attr.grh.sgid_index as usize)
                        .map(|g| g.gid)
                        .unwrap_or_default();
                    if let Some(r) = remote {
                        let name = format!("fabric-snd-{:06x}", inner.qpn);
                        let i2 = inner.clone();
                        match std::thread::Builder::new()
                            .name(name)
                            .spawn(move || wire::run_sender(i2, r, sgid))
                        {
                            Ok(h) => inner.lock().sender = Some(h),
                            Err(_) => return libc::ENOMEM,
                        }
                    }
                }
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// # Safety
/// `qp` from `ibv_create_qp`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard(libc::EINVAL, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: qp was created by Box::into_raw in create_qp.
        let mut q = unsafe { Box::from_raw(qp as *mut Qp) };
        wire::shutdown(&q.inner);
        if let Some(h) = q.acceptor.take() {
            let _ = h.join();
        }
        drop(q.listener.take());
        let _ = std::fs::remove_file(&q.inner.sock_path);
        0
    })
}

const STATUS_STR: &[&std::ffi::CStr] = &[
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM Rendezvous Request error",
];

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    STATUS_STR
        .get(status as usize)
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        let Ok(n) = usize::try_from(n) else { return -1 };
        // SAFETY: cq is a live Cq (the header's ibv_poll_cq passes the app's CQ).
        let Some(c) = (unsafe { (cq as *const Cq).as_ref() }) else {
            return -1;
        };
        if n == 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        // SAFETY: wc points to n writable entries per ibv_poll_cq's contract.
        let out = unsafe { std::slice::from_raw_parts_mut(wc, n) };
        c.inner.poll(out) as c_int
    })
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, _solicited_only: c_int) -> c_int {
    guard(libc::EINVAL, || {
        // SAFETY: cq is a live Cq.
        let Some(c) = (unsafe { (cq as *const Cq).as_ref() }) else {
            return libc::EINVAL;
        };
        c.inner.arm().map_or_else(|e| e.errno(), |_| 0)
    })
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EINVAL, || {
        // SAFETY: qp is a live Qp.
        let Some(q) = (unsafe { (qp as *const Qp).as_ref() }) else {
            return libc::EINVAL;
        };
        let mut cur = wr;
        // SAFETY: wr is a NULL-terminated chain of valid WRs per ibv_post_send's contract.
        while let Some(w) = unsafe { cur.as_ref() } {
            // SAFETY: as above; SGEs describe readable memory.
            if let Err(e) = unsafe { q.inner.post_send(w) } {
                if !bad.is_null() {
                    // SAFETY: bad is writable per the contract.
                    unsafe { *bad = cur };
                }
                return e.errno();
            }
            cur = w.next;
        }
        0
    })
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EINVAL, || {
        // SAFETY: qp is a live Qp.
        let Some(q) = (unsafe { (qp as *const Qp).as_ref() }) else {
            return libc::EINVAL;
        };
        let mut cur = wr;
        // SAFETY: wr is a NULL-terminated chain of valid WRs per ibv_post_recv's contract.
        while let Some(w) = unsafe { cur.as_ref() } {
            // SAFETY: as above.
            if let Err(e) = unsafe { q.inner.post_recv(w) } {
                if !bad.is_null() {
                    // SAFETY: bad is writable per the contract.
                    unsafe { *bad = cur };
                }
                return e.errno();
            }
            cur = w.next;
        }
        0
    })
}
